"""The lean OTLP/gRPC exporter against a real receiver: spans arrive whole, the standard
``OTEL_EXPORTER_OTLP_*`` settings apply, and a collector that is down costs a failed batch,
not an exception or a hang — and is used again once it is back."""

from __future__ import annotations

import asyncio
import time

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

from services.common.net import free_port
from services.common.tracing.otlp_grpc import LeanOtlpSpanExporter
from services.common.tracing.tracer import LeanTracer
from tests.support.otlp import OtlpReceiver


def some_spans() -> tuple[ReadableSpan, ...]:
    memory = InMemorySpanExporter()
    processor = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]  # SDK: no -> None
    processor.add_span_processor(SimpleSpanProcessor(memory))
    tracer = LeanTracer(
        resource=Resource.create({"service.name": "meridian-edge"}),
        sampler=ParentBased(ALWAYS_ON),
        processor=processor,
        scope=InstrumentationScope("meridian.edge", "", ""),
    )
    with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER):
        attempt = tracer.start_span("edge.attempt", attributes={"meridian.region": "kr"})
        attempt.add_event("first_token", {"meridian.ttft_ms": 3.5})
        attempt.end()
    return memory.get_finished_spans()


async def test_exported_spans_arrive_whole_with_the_configured_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = OtlpReceiver()
    endpoint = await receiver.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=acme,authorization=Bearer%20t")
    exporter = LeanOtlpSpanExporter(endpoint=endpoint, insecure=True)
    try:
        spans = some_spans()
        assert await asyncio.to_thread(exporter.export, spans) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        await receiver.stop()
    server, attempt = sorted(receiver.spans, key=lambda s: s.name)
    assert server.name == "POST /v1/chat/completions"
    assert server.service == "meridian-edge"
    assert attempt.parent_span_id == server.span_id
    assert attempt.trace_id == server.trace_id
    assert attempt.attributes == {"meridian.region": "kr"}
    assert attempt.events == ("first_token",)
    assert receiver.metadata[0]["x-tenant"] == "acme"
    assert receiver.metadata[0]["authorization"] == "Bearer t"


async def test_a_collector_that_is_down_fails_the_batch_and_is_used_again_once_back() -> None:
    port = free_port()
    exporter = LeanOtlpSpanExporter(endpoint=f"http://127.0.0.1:{port}", insecure=True, timeout=2)
    spans = some_spans()
    try:
        started = time.monotonic()
        result = await asyncio.to_thread(exporter.export, spans)
        assert result is SpanExportResult.FAILURE
        assert time.monotonic() - started < 10  # bounded by the timeout and retries
        receiver = OtlpReceiver()
        await receiver.start(port)
        try:
            # The first failure made the exporter rebuild its channel (and our stub on it).
            result = await asyncio.to_thread(exporter.export, spans)
            assert result is SpanExportResult.SUCCESS
            assert {s.name for s in receiver.spans} == {s.name for s in spans}
        finally:
            await receiver.stop()
    finally:
        exporter.shutdown()
