"""The lean tracer behaves as the SDK's tracer does: same spans out for the same calls (checked
on the OTLP they encode to), same sampling, limits, status and exception rules."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    ReadableSpan,
    SpanLimits,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from services.common.tracing.otlp_wire import encode_export_request
from services.common.tracing.tracer import LeanSpan, LeanTracer

RESOURCE = Resource.create({"service.name": "meridian-test"})
REMOTE = SpanContext(
    0x4BF92F3577B34DA6A3CE929D0E0E4736,
    0x00F067AA0BA902B7,
    is_remote=True,
    trace_flags=TraceFlags(1),
    trace_state=TraceState([("vendor", "abc")]),
)
T0 = 1_700_000_000_000_000_000


class CountingIds(IdGenerator):
    """Deterministic ids, so two tracers given the same calls make the same spans."""

    def __init__(self) -> None:
        self.n = 0

    def generate_span_id(self) -> int:
        self.n += 1
        return self.n

    def generate_trace_id(self) -> int:
        self.n += 1
        return (0xABC << 64) + self.n


def sdk_tracer(
    exporter: InMemorySpanExporter, sampler: Sampler, limits: SpanLimits | None
) -> trace.Tracer:
    provider = TracerProvider(
        resource=RESOURCE, sampler=sampler, span_limits=limits, id_generator=CountingIds()
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("meridian.test")


def lean_tracer(
    exporter: InMemorySpanExporter, sampler: Sampler, limits: SpanLimits | None
) -> LeanTracer:
    processor = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]  # SDK: no -> None
    processor.add_span_processor(SimpleSpanProcessor(exporter))
    return LeanTracer(
        resource=RESOURCE,
        sampler=sampler,
        processor=processor,
        scope=InstrumentationScope("meridian.test"),
        limits=limits or SpanLimits(),
        id_generator=CountingIds(),
    )


def both(
    scenario: Callable[[trace.Tracer], None],
    sampler: Sampler | None = None,
    limits: SpanLimits | None = None,
) -> tuple[tuple[ReadableSpan, ...], tuple[ReadableSpan, ...]]:
    sdk, lean = InMemorySpanExporter(), InMemorySpanExporter()
    sampler = sampler or ParentBased(ALWAYS_ON)
    scenario(sdk_tracer(sdk, sampler, limits))
    scenario(lean_tracer(lean, sampler, limits))
    return sdk.get_finished_spans(), lean.get_finished_spans()


def normalised(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    """Clock readings and stack traces differ between two runs of the same calls."""
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.start_time_unix_nano = span.end_time_unix_nano = 0
                for event in span.events:
                    event.time_unix_nano = 0
                    for kv in event.attributes:
                        if kv.key == "exception.stacktrace":
                            kv.value.string_value = "…"
    return request


def assert_same_spans(scenario: Callable[[trace.Tracer], None], **kwargs: object) -> None:
    sdk_spans, lean_spans = both(scenario, **kwargs)  # type: ignore[arg-type]
    assert lean_spans
    assert all(isinstance(s, LeanSpan) for s in lean_spans)
    expected = normalised(encode_spans(sdk_spans))
    assert normalised(encode_spans(lean_spans)) == expected  # the SDK's encoder reads them
    ours = ExportTraceServiceRequest.FromString(encode_export_request(lean_spans))
    assert normalised(ours) == expected


def edge_like_request(tracer: trace.Tracer) -> None:
    parent = trace.set_span_in_context(trace.NonRecordingSpan(REMOTE))
    with tracer.start_as_current_span(
        "POST /v1/chat/completions",
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": "POST", "url.path": "/v1/chat/completions"},
    ) as request_span:
        stage = tracer.start_span("edge.route", start_time=T0)
        stage.set_attributes({"meridian.region": "kr", "meridian.candidates": 3})
        stage.end(end_time=T0 + 1000)
        attempt = tracer.start_span(
            "edge.attempt",
            kind=SpanKind.CLIENT,
            attributes={"meridian.worker": "kr-0", "meridian.attempt": 1},
            links=[Link(REMOTE, {"meridian.reason": "retry"})],
            start_time=T0,
        )
        attempt.add_event("first_token", {"meridian.ttft_ms": 12.5}, timestamp=T0 + 5)
        attempt.set_attribute("meridian.worker", "kr-1")  # moves last, as in the SDK
        attempt.set_attribute("gen_ai.usage.output_tokens", 8)
        attempt.set_status(Status(StatusCode.ERROR, "worker failed"))
        attempt.end(end_time=T0 + 2000)
        request_span.set_attribute("http.response.status_code", 200)
        request_span.update_name("POST /v1/chat/completions (done)")


def test_an_edge_like_request_makes_the_same_spans_as_the_sdk() -> None:
    assert_same_spans(edge_like_request)


def test_limits_drop_the_same_attributes_events_and_links_as_the_sdk() -> None:
    def crowded(tracer: trace.Tracer) -> None:
        span = tracer.start_span(
            "crowded",
            attributes={"a": 1, "b": "two", "c": [1, 2]},
            links=[Link(REMOTE, {"x": 1, "y": 2}), Link(REMOTE)],
        )
        span.set_attribute("d", "x" * 50)
        for i in range(4):
            span.add_event(f"e{i}", {"i": i, "j": str(i), "k": 0.5})
        span.end()

    assert_same_spans(
        crowded,
        limits=SpanLimits(
            max_span_attributes=2,
            max_events=2,
            max_links=1,
            max_event_attributes=2,
            max_link_attributes=1,
            max_attribute_length=8,
        ),
    )


def test_an_exception_is_recorded_and_marks_the_span_as_the_sdk_does() -> None:
    def failing(tracer: trace.Tracer) -> None:
        with (
            pytest.raises(KeyError, match="no such worker"),
            tracer.start_as_current_span("outer"),
            tracer.start_as_current_span("quiet", record_exception=False),
        ):
            raise KeyError("no such worker")
        with pytest.raises(ValueError, match="bad"), tracer.start_span("as a context manager"):
            raise ValueError("bad")

    assert_same_spans(failing)


def test_sampling_decides_as_the_sdk_does() -> None:
    def many_roots(tracer: trace.Tracer) -> None:
        for i in range(200):
            tracer.start_span(f"r{i}").end()

    sdk_spans, lean_spans = both(many_roots, sampler=TraceIdRatioBased(0.5))
    assert [s.name for s in lean_spans] == [s.name for s in sdk_spans]


def test_a_not_sampled_parent_gives_a_non_recording_span_in_the_same_trace() -> None:
    exporter = InMemorySpanExporter()
    tracer = lean_tracer(exporter, ParentBased(ALWAYS_ON), None)
    not_sampled = SpanContext(REMOTE.trace_id, REMOTE.span_id, True, TraceFlags(0))
    parent = trace.set_span_in_context(trace.NonRecordingSpan(not_sampled))
    with tracer.start_as_current_span("child", context=parent) as span:
        assert not span.is_recording()
        ctx = span.get_span_context()
        assert ctx.trace_id == REMOTE.trace_id
        assert not ctx.trace_flags.sampled
    assert exporter.get_finished_spans() == ()


def test_the_span_is_current_inside_its_block_and_the_parent_again_after() -> None:
    tracer = lean_tracer(InMemorySpanExporter(), ParentBased(ALWAYS_ON), None)
    with tracer.start_as_current_span("outer") as outer:
        with tracer.start_as_current_span("inner") as inner:
            assert trace.get_current_span() is inner
            assert inner.parent == outer.get_span_context()  # type: ignore[attr-defined]
        assert trace.get_current_span() is outer
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_an_ended_span_ignores_further_writes_and_is_exported_once() -> None:
    exporter = InMemorySpanExporter()
    tracer = lean_tracer(exporter, ParentBased(ALWAYS_ON), None)
    span = tracer.start_span("once", attributes={"a": 1})
    span.end()
    span.set_attribute("a", 2)
    span.add_event("late")
    span.set_status(StatusCode.ERROR)
    span.update_name("renamed")
    span.end()
    (finished,) = exporter.get_finished_spans()
    assert finished.name == "once"
    assert finished.attributes == {"a": 1}
    assert finished.events == ()
    assert finished.status.status_code is StatusCode.UNSET
    assert not span.is_recording()


def status_code(span: trace.Span) -> StatusCode:
    """The status a lean span holds now (read afresh: mypy would keep an asserted value
    narrowed across the ``set_status`` calls that change it)."""
    assert isinstance(span, LeanSpan)
    return span.status.status_code


def test_ok_status_is_final_and_unset_never_overwrites() -> None:
    tracer = lean_tracer(InMemorySpanExporter(), ParentBased(ALWAYS_ON), None)
    span = tracer.start_span("s")
    span.set_status(StatusCode.ERROR, "first")
    span.set_status(StatusCode.UNSET)
    assert status_code(span) is StatusCode.ERROR
    span.set_status(Status(StatusCode.OK))
    span.set_status(StatusCode.ERROR, "too late")
    assert status_code(span) is StatusCode.OK


async def test_a_cancelled_task_does_not_turn_its_span_into_an_error() -> None:
    """Like ``trace.use_span``: only ``Exception`` s are errors; cancellation is not."""
    exporter = InMemorySpanExporter()
    tracer = lean_tracer(exporter, ParentBased(ALWAYS_ON), None)

    async def stream() -> None:
        with tracer.start_as_current_span("stream"):
            await asyncio.sleep(10)

    task = asyncio.create_task(stream())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.UNSET
    assert span.events == ()


def test_bad_attribute_keys_are_dropped_and_odd_values_cleaned() -> None:
    exporter = InMemorySpanExporter()
    tracer = lean_tracer(exporter, ParentBased(ALWAYS_ON), None)
    span = tracer.start_span("s")
    span.set_attribute("", 1)
    span.set_attribute("list", [1, 2])
    # Not an AnyValue on purpose: the API cleans it to str() of the enum.
    span.set_attribute("obj", StatusCode.OK)  # type: ignore[arg-type]
    span.end()
    (finished,) = exporter.get_finished_spans()
    assert finished.attributes == {"list": (1, 2), "obj": str(StatusCode.OK)}


@pytest.mark.parametrize("parent_sampled", [True, False])
def test_children_follow_their_parent_as_the_sdk_decides(parent_sampled: bool) -> None:
    """The shortcut for the standard parent-based sampler, and a parent-based sampler with
    other delegates (which must still be asked), both decide as the SDK does."""
    parent_ctx = SpanContext(REMOTE.trace_id, REMOTE.span_id, True, TraceFlags(parent_sampled))

    def children(tracer: trace.Tracer) -> None:
        parent = trace.set_span_in_context(trace.NonRecordingSpan(parent_ctx))
        with tracer.start_as_current_span("child", context=parent, attributes={"a": 1}):
            tracer.start_span("grandchild").end()

    inverted = ParentBased(
        ALWAYS_ON,
        remote_parent_sampled=ALWAYS_OFF,
        remote_parent_not_sampled=ALWAYS_ON,
        local_parent_sampled=ALWAYS_OFF,
        local_parent_not_sampled=ALWAYS_ON,
    )
    for sampler in (ParentBased(ALWAYS_ON), inverted):
        sdk_spans, lean_spans = both(children, sampler=sampler)
        assert [s.name for s in lean_spans] == [s.name for s in sdk_spans]
        assert normalised(encode_spans(lean_spans)) == normalised(encode_spans(sdk_spans))
    # The inverted sampler really was asked at each level: it flips the decision every time.
    _, lean_spans = both(children, sampler=inverted)
    assert [s.name for s in lean_spans] == (["grandchild"] if parent_sampled else ["child"])


def test_with_nothing_to_export_to_spans_keep_ids_and_decisions_but_record_nothing() -> None:
    """No exporter configured: the trace still propagates (ids in logs, ``x-trace-id``,
    ``traceparent`` with its sampled flag) without the cost of recording spans nobody reads."""
    tracer = LeanTracer(
        resource=RESOURCE,
        sampler=ParentBased(ALWAYS_ON),
        processor=None,
        scope=InstrumentationScope("meridian.test"),
    )
    parent = trace.set_span_in_context(trace.NonRecordingSpan(REMOTE))
    with tracer.start_as_current_span("request", context=parent) as span:
        assert not span.is_recording()
        ctx = span.get_span_context()
        assert ctx.is_valid
        assert ctx.trace_id == REMOTE.trace_id
        assert ctx.span_id != REMOTE.span_id
        assert ctx.trace_flags.sampled
        child = tracer.start_span("child")
        assert child.get_span_context().trace_id == REMOTE.trace_id
    root = tracer.start_span("root")
    assert root.get_span_context().is_valid
    assert root.get_span_context().trace_flags.sampled
