"""Traces, metrics and log lines of the upstream hop.

- A CLIENT span ``worker.upstream`` per request, child of the worker's ``worker.Generate``
  (whose context the service passes in ``EngineRequest.traceparent``) and sent on to the
  upstream in ``traceparent``, so a vLLM server with tracing on joins the same trace;
  attributes: upstream URL, HTTP status, tokens, outcome; a ``first_token`` event.
- ``meridian.worker.upstream.requests`` by outcome (ok, cancelled, aborted, refused,
  unreachable, failed) and ``meridian.worker.upstream.time_to_first_token``.
- One ``upstream.done`` (or ``upstream.failed``) line per request with the trace id.

Instruments are no-ops until the worker hands the engine its tracer and meter
(``UpstreamEngine.instrument``), as the engine is built from flags before telemetry is set up.
"""

from __future__ import annotations

import logging

from opentelemetry import trace
from opentelemetry.metrics import Meter, NoOpMeter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.common import metric_names as mn
from services.common.logs import event

log = logging.getLogger("meridian.worker.upstream")
_PROPAGATOR = TraceContextTextMapPropagator()


class UpstreamTelemetry:
    def __init__(self, *, tracer: trace.Tracer | None = None, meter: Meter | None = None) -> None:
        self.tracer = tracer or trace.NoOpTracer()
        meter = meter or NoOpMeter("meridian.worker.upstream")
        self.requests = meter.create_counter(
            mn.WORKER_UPSTREAM_REQUESTS,
            unit="{request}",
            description="Requests sent to the upstream server, by outcome",
        )
        self.ttft = meter.create_histogram(
            mn.WORKER_UPSTREAM_TTFT,
            unit="s",
            description="Request sent upstream to its first token back",
        )

    def start(self, *, request_id: str, model: str, url: str, traceparent: str) -> Span:
        parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
        return self.tracer.start_span(
            "worker.upstream",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes={
                "meridian.request_id": request_id[:128],
                mn.MODEL: model[:256],
                "url.full": url,
            },
        )

    @staticmethod
    def headers(span: Span) -> dict[str, str]:
        """``traceparent`` (and ``tracestate``) for the upstream request, from ``span``."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        return carrier

    def end(
        self,
        span: Span,
        *,
        request_id: str,
        model: str,
        outcome: str,
        status: int | None,
        completion_tokens: int,
        ttft_s: float | None,
        duration_s: float,
        error: str | None = None,
    ) -> None:
        self.requests.add(1, {mn.MODEL: model, mn.OUTCOME: outcome})
        if ttft_s is not None:
            self.ttft.record(ttft_s, {mn.MODEL: model})
        if status is not None:
            span.set_attribute(mn.STATUS_CODE, status)
        span.set_attribute(mn.OUTCOME, outcome)
        span.set_attribute("gen_ai.usage.output_tokens", completion_tokens)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        with trace.use_span(span, end_on_exit=True):
            event(
                log,
                "upstream.failed" if error is not None else "upstream.done",
                level=logging.WARNING if error is not None else logging.INFO,
                request_id=request_id,
                model=model,
                outcome=outcome,
                status=status,
                completion_tokens=completion_tokens,
                ttft_ms=None if ttft_s is None else round(ttft_s * 1000, 2),
                duration_ms=round(duration_s * 1000, 2),
                **({"error": error} if error is not None else {}),
            )
