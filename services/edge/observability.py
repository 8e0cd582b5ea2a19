"""The edge's traces and metrics.

- A SERVER span per HTTP request (``POST /v1/chat/completions``), child of the client's
  ``traceparent`` when it sends one; its trace id goes back in ``x-trace-id``.
- One span per pipeline stage (``edge.authenticate`` … ``edge.stream``), siblings under the
  request span (see :func:`services.edge.pipeline.build_chain`); the router's ``Route`` and the
  worker's ``Generate`` spans are children of ``edge.route`` and of each ``edge.attempt``.
- Metrics, with the GenAI semantic conventions' names: time to first token and time per output
  token *as the client sees them* (routing and failover included), request duration, token
  usage, requests by status; and every :class:`EdgeCounters` field as one counter family
  (``meridian.edge.events{meridian.event=…}``), rejections as
  ``meridian.edge.rejections{meridian.reason=…}``, live streams as a gauge, and the time the
  event loop was stalled (``meridian.edge.event_loop.stalled``: a busy or GC-bound edge).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeter, Observation

from services.common import metric_names as mn
from services.edge.counters import EdgeCounters

#: EdgeCounters fields that are a refusal of the client's request, by reason.
REJECTION_FIELDS: tuple[str, ...] = (
    "connections_refused_ip",
    "connections_refused_edge",
    "header_timeouts",
    "bad_http_requests",
    "headers_too_large",
    "body_timeouts",
    "bodies_too_large",
    "ip_rate_limited",
    "streams_refused_ip",
    "streams_refused_edge",
    "refused_while_draining",
    "auth_missing",
    "auth_malformed",
    "auth_invalid",
    "auth_disabled_tenant",
    "invalid_requests",
    "models_not_allowed",
    "too_many_messages",
    "prompts_too_long",
    "rate_limited_requests",
    "rate_limited_tokens",
    "rate_limited_streams",
    "rate_limited_too_large",
    "limiter_fail_closed",
)


class EdgeTelemetry:
    """Instruments of one edge process. Built with a no-op tracer and meter by default."""

    def __init__(
        self,
        *,
        tracer: trace.Tracer | None = None,
        meter: Meter | None = None,
        counters: EdgeCounters,
        active_streams: Callable[[], int],
        loop_stalled_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.tracer = tracer or trace.NoOpTracer()
        meter = meter or NoOpMeter("meridian.edge")
        self._counters = counters
        self._active_streams = active_streams
        self._loop_stalled_s = loop_stalled_s
        self.ttft = meter.create_histogram(
            mn.TTFT, unit="s", description="Time to first token as the client sees it"
        )
        self.tpot = meter.create_histogram(
            mn.TPOT, unit="s", description="Time per output token after the first"
        )
        self.duration = meter.create_histogram(
            mn.REQUEST_DURATION, unit="s", description="Chat request duration at the edge"
        )
        self.tokens = meter.create_histogram(
            mn.TOKEN_USAGE, unit="{token}", description="Tokens per request, input and output"
        )
        self.requests = meter.create_counter(
            mn.EDGE_REQUESTS, unit="{request}", description="HTTP requests by status"
        )
        self.failovers = meter.create_counter(
            mn.EDGE_FAILOVERS, unit="{attempt}", description="Attempts beyond the first"
        )
        self.migrations = meter.create_counter(
            mn.EDGE_MIGRATIONS,
            unit="{migration}",
            description="Mid-stream breaks by trigger and outcome (migrated, refused, ...)",
        )
        self.migration_gap = meter.create_histogram(
            mn.EDGE_MIGRATION_GAP,
            unit="s",
            description="Time the client saw without a token across a migration",
        )
        meter.create_observable_counter(
            "meridian.edge.events",
            callbacks=[self._observe_events],
            unit="{event}",
            description="Every EdgeCounters field, by name",
        )
        meter.create_observable_counter(
            mn.EDGE_REJECTIONS,
            callbacks=[self._observe_rejections],
            unit="{request}",
            description="Requests and connections refused, by reason",
        )
        meter.create_observable_gauge(
            mn.EDGE_ACTIVE_STREAMS,
            callbacks=[self._observe_streams],
            unit="{stream}",
            description="Streams open now",
        )
        meter.create_observable_counter(
            mn.EDGE_LOOP_STALLED,
            callbacks=[self._observe_loop_stalls],
            unit="s",
            description="Time the edge's event loop could not run a ready timer (GC, CPU)",
        )

    def _observe_loop_stalls(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self._loop_stalled_s())]

    def _observe_events(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(v, {"meridian.event": k}) for k, v in self._counters.snapshot().items()]

    def _observe_rejections(self, options: CallbackOptions) -> Iterable[Observation]:
        snap = self._counters.snapshot()
        return [Observation(snap[f], {mn.REASON: f}) for f in REJECTION_FIELDS]

    def _observe_streams(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self._active_streams())]

    def record_migration(self, trigger: str, outcome: str, gap_s: float | None) -> None:
        """One mid-stream break: how it was handled and, if moved, the client's gap."""
        if outcome == "migrated":
            self._counters.migrations += 1
        elif outcome != "cancelled":
            self._counters.migrations_failed += 1
        self.migrations.add(1, {mn.TRIGGER: trigger, mn.OUTCOME: outcome})
        if gap_s is not None:
            self.migration_gap.record(gap_s, {mn.TRIGGER: trigger})

    def record_completion(
        self,
        *,
        model: str,
        region: str,
        started: float,
        first_token_at: float,
        last_token_at: float,
        prompt_tokens: int,
        completion_tokens: int,
        attempts: int,
        operation: str = "chat",
    ) -> None:
        """One finished (or cut short) stream; times are ``time.monotonic()`` seconds.
        ``operation``: "chat" or "text_completion" (GenAI's ``gen_ai.operation.name``)."""
        attrs: dict[str, str | int] = {mn.MODEL: model, mn.REGION: region, mn.OPERATION: operation}
        self.ttft.record(first_token_at - started, attrs)
        if completion_tokens > 1:
            self.tpot.record((last_token_at - first_token_at) / (completion_tokens - 1), attrs)
        self.tokens.record(prompt_tokens, {**attrs, mn.TOKEN_TYPE: "input"})
        self.tokens.record(completion_tokens, {**attrs, mn.TOKEN_TYPE: "output"})
        if attempts > 1:
            self.failovers.add(attempts - 1, {mn.REGION: region})

    def record_embedding(
        self, *, model: str, region: str, started: float, prompt_tokens: int, attempts: int
    ) -> None:
        """One answered embeddings request: its duration and input tokens (no output)."""
        attrs: dict[str, str | int] = {
            mn.MODEL: model,
            mn.REGION: region,
            mn.OPERATION: "embeddings",
        }
        self.duration.record(time.monotonic() - started, attrs)
        self.tokens.record(prompt_tokens, {**attrs, mn.TOKEN_TYPE: "input"})
        if attempts > 1:
            self.failovers.add(attempts - 1, {mn.REGION: region})
