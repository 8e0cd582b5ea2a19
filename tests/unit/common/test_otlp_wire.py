"""The lean OTLP encoder writes exactly the message the SDK's encoder builds, for every shape
of span the API can make."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from services.common.tracing.otlp_wire import encode_export_request

REMOTE = SpanContext(
    0x4BF92F3577B34DA6A3CE929D0E0E4736,
    0x00F067AA0BA902B7,
    is_remote=True,
    trace_flags=TraceFlags(1),
    trace_state=TraceState([("vendor", "abc"), ("other", "x-1")]),
)


def spans_from(
    build: Callable[[trace.Tracer], None],
    *,
    resource: Resource | None = None,
    limits: SpanLimits | None = None,
    scope: tuple[str, str | None, str | None] = ("meridian.test", None, None),
) -> Sequence[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=resource or Resource.create({"service.name": "t"}), span_limits=limits
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    name, version, schema_url = scope
    build(provider.get_tracer(name, version, schema_url=schema_url))
    return exporter.get_finished_spans()


def assert_same_as_sdk(spans: Sequence[ReadableSpan]) -> None:
    ours = ExportTraceServiceRequest.FromString(encode_export_request(spans))
    assert ours == encode_spans(spans)


def test_a_plain_span_encodes_as_the_sdk_does() -> None:
    assert_same_as_sdk(spans_from(lambda t: t.start_span("edge.route").end()))


def test_every_attribute_type_encodes_as_the_sdk_does() -> None:
    def build(tracer: trace.Tracer) -> None:
        with tracer.start_as_current_span(
            "all types",
            kind=SpanKind.CLIENT,
            attributes={
                "s": "kr",
                "empty": "",
                "unicode": "서울 ✓",
                "t": True,
                "f": False,
                "zero": 0,
                "i": 42,
                "big": 2**62,
                "neg": -7,
                "min": -(2**63),
                "d": 1.5,
                "negd": -0.25,
                "b": b"\x00\xff",
                "strs": ["a", "b"],
                "ints": (1, 2, 3),
                "floats": [0.5],
                "bools": [True, False],
                "empty list": [],
                "long": "x" * 300,
            },
        ) as span:
            span.set_attribute("late", 7)
            span.set_attribute("s", "jp")  # overwritten: moves last, as in the SDK

    assert_same_as_sdk(spans_from(build))


def test_kinds_status_events_links_and_parents_encode_as_the_sdk_does() -> None:
    def build(tracer: trace.Tracer) -> None:
        parent_ctx = trace.set_span_in_context(trace.NonRecordingSpan(REMOTE))
        for kind in SpanKind:
            with tracer.start_as_current_span(f"k{kind.value}", context=parent_ctx, kind=kind):
                pass
        with tracer.start_as_current_span("root") as root:
            root.add_event("first_token", {"meridian.ttft_ms": 12.5})
            root.add_event("no attributes")
            root.set_status(Status(StatusCode.ERROR, "worker failed"))
            child = tracer.start_span("child", links=[Link(REMOTE, {"why": "retry"})])
            child.set_status(StatusCode.OK)
            child.end()
        with pytest.raises(ValueError, match="boom"), tracer.start_as_current_span("raises"):
            raise ValueError("boom")

    assert_same_as_sdk(spans_from(build))


def test_dropped_counts_encode_as_the_sdk_does() -> None:
    limits = SpanLimits(max_span_attributes=2, max_events=1, max_links=1, max_event_attributes=1)

    def build(tracer: trace.Tracer) -> None:
        span = tracer.start_span(
            "crowded",
            attributes={"a": 1, "b": 2, "c": 3},
            links=[Link(REMOTE), Link(REMOTE, {"n": 2})],
        )
        span.add_event("e1", {"x": 1, "y": 2})
        span.add_event("e2")
        span.end()

    spans = spans_from(build, limits=limits)
    assert spans[0].dropped_attributes == 1
    assert spans[0].dropped_events == 1
    assert_same_as_sdk(spans)


def test_resources_and_scopes_group_as_the_sdk_groups_them() -> None:
    def two_spans(tracer: trace.Tracer) -> None:
        for name in ("a", "b"):
            tracer.start_span(name).end()

    first = spans_from(
        two_spans,
        resource=Resource.create({"service.name": "edge", "meridian.site": "kr"}, "https://x/1"),
        scope=("meridian.edge", "1.2.3", "https://opentelemetry.io/schemas/1.26.0"),
    )
    second = spans_from(lambda t: t.start_span("c").end(), scope=("other", None, None))
    third = spans_from(
        lambda t: t.start_span("d").end(),
        resource=Resource.create({"service.name": "edge", "meridian.site": "kr"}, "https://x/1"),
        scope=("meridian.edge", "1.2.3", "https://opentelemetry.io/schemas/1.26.0"),
    )
    spans = [*first, *second, *third]
    assert_same_as_sdk(spans)
    request = ExportTraceServiceRequest.FromString(encode_export_request(spans))
    assert [len(rs.scope_spans) for rs in request.resource_spans] == [1, 1]
    assert [s.name for s in request.resource_spans[0].scope_spans[0].spans] == ["a", "b", "d"]


def test_repeated_values_reuse_their_cached_bytes_without_mixing_types() -> None:
    """The cache is keyed by type too: True, 1 and 1.0 are equal in Python but not in OTLP."""

    def build(tracer: trace.Tracer) -> None:
        for value in (True, 1, 1.0, "1", 1, True):
            tracer.start_span("s", attributes={"v": value}).end()

    spans = spans_from(build)
    assert_same_as_sdk(spans)
    request = ExportTraceServiceRequest.FromString(encode_export_request(spans))
    kinds = [
        s.attributes[0].value.WhichOneof("value")
        for s in request.resource_spans[0].scope_spans[0].spans
    ]
    assert kinds == [
        "bool_value",
        "int_value",
        "double_value",
        "string_value",
        "int_value",
        "bool_value",
    ]


def test_an_int_beyond_int64_is_left_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    spans = spans_from(lambda t: t.start_span("s", attributes={"ok": 1, "huge": 2**64}).end())
    with caplog.at_level(logging.WARNING):
        request = ExportTraceServiceRequest.FromString(encode_export_request(spans))
    (span,) = request.resource_spans[0].scope_spans[0].spans
    assert [a.key for a in span.attributes] == ["ok"]
    assert "huge" in caplog.text


def test_no_spans_is_an_empty_request() -> None:
    assert encode_export_request([]) == b""
    assert ExportTraceServiceRequest.FromString(b"") == encode_spans([])
