"""The worker's traces and metrics.

- A SERVER span ``worker.Generate`` per request, child of the edge's ``edge.attempt`` span
  (context in gRPC metadata): engine queue and prefill times, a ``first_token`` event, tokens
  out, finish reason, and ``meridian.aborted`` when the caller went away.
- Metrics inside the engine (GenAI names): time to first token, time per output token, queue
  time, token usage, requests by finish reason; and load gauges read from ``engine.load()`` at
  scrape time (running, waiting, KV-cache use, GPU use, tokens/s) — the same figures the router
  receives in load reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeter, Observation

from services.common import metric_names as mn
from services.worker.engine import EngineLoad


class WorkerTelemetry:
    def __init__(
        self,
        *,
        tracer: trace.Tracer | None = None,
        meter: Meter | None = None,
        worker_id: str = "",
        region: str = "",
        load: Callable[[], EngineLoad] | None = None,
    ) -> None:
        self.tracer = tracer or trace.NoOpTracer()
        meter = meter or NoOpMeter("meridian.worker")
        self._attrs = {mn.WORKER: worker_id, mn.REGION: region}
        self._load = load
        self.ttft = meter.create_histogram(
            mn.TTFT, unit="s", description="Arrival at the worker to first token"
        )
        self.tpot = meter.create_histogram(
            mn.TPOT, unit="s", description="Time per output token after the first"
        )
        self.queue_time = meter.create_histogram(
            mn.WORKER_QUEUE_TIME, unit="s", description="Time waiting for the engine to schedule"
        )
        self.tokens = meter.create_histogram(
            mn.TOKEN_USAGE, unit="{token}", description="Tokens per request, input and output"
        )
        self.requests = meter.create_counter(
            mn.WORKER_REQUESTS, unit="{request}", description="Requests by finish reason"
        )
        self.tool_calls = meter.create_counter(
            mn.WORKER_TOOL_CALLS, unit="{call}", description="Tool calls the engine returned"
        )
        self.dropped_messages = meter.create_counter(
            mn.WORKER_DROPPED_MESSAGES,
            unit="{message}",
            description="Oldest messages dropped for prompts to fit (truncation auto)",
        )
        self.embed_duration = meter.create_histogram(
            mn.WORKER_EMBED_DURATION, unit="s", description="Embed calls, arrival to answer"
        )
        self.embed_inputs = meter.create_counter(
            mn.WORKER_EMBED_INPUTS, unit="{input}", description="Inputs embedded"
        )
        gauges = (
            (mn.WORKER_RUNNING, "{request}", "Requests being decoded", lambda x: x.running),
            (mn.WORKER_WAITING, "{request}", "Requests queued", lambda x: x.waiting),
            (mn.WORKER_KV_CACHE, "1", "KV-cache use", lambda x: x.kv_cache_usage),
            (
                mn.WORKER_TOKENS_PER_SECOND,
                "{token}/s",
                "Generated tokens/s",
                lambda x: x.tokens_per_second,
            ),
        )
        for name, unit, description, read in gauges:
            meter.create_observable_gauge(
                name, callbacks=[self._gauge(read)], unit=unit, description=description
            )
        meter.create_observable_gauge(
            mn.WORKER_GPU, callbacks=[self._observe_gpus], unit="1", description="GPU use"
        )

    def _gauge(
        self, read: Callable[[EngineLoad], float]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            if self._load is None:
                return []
            return [Observation(read(self._load()), self._attrs)]

        return observe

    def _observe_gpus(self, options: CallbackOptions) -> Iterable[Observation]:
        if self._load is None:
            return []
        return [
            Observation(g.utilization, {**self._attrs, "meridian.gpu": g.index})
            for g in self._load().gpus
        ]

    def record_tool_calls(self, *, model: str, calls: int) -> None:
        self.tool_calls.add(calls, {**self._attrs, mn.MODEL: model})

    def record_dropped_messages(self, *, model: str, messages: int) -> None:
        self.dropped_messages.add(messages, {**self._attrs, mn.MODEL: model})

    def record(
        self,
        *,
        model: str,
        finish: str,
        arrived: float,
        first_token_at: float | None,
        last_token_at: float | None,
        queue_ms: float | None,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        """One request's end (``time.monotonic()`` seconds)."""
        attrs: dict[str, str] = {**self._attrs, mn.MODEL: model}
        self.requests.add(1, {**attrs, mn.FINISH: finish})
        if first_token_at is not None:
            self.ttft.record(first_token_at - arrived, attrs)
            if last_token_at is not None and completion_tokens > 1:
                self.tpot.record((last_token_at - first_token_at) / (completion_tokens - 1), attrs)
        if queue_ms is not None:
            self.queue_time.record(queue_ms / 1000, attrs)
        self.tokens.record(prompt_tokens, {**attrs, mn.TOKEN_TYPE: "input"})
        self.tokens.record(completion_tokens, {**attrs, mn.TOKEN_TYPE: "output"})

    def record_embed(
        self, *, model: str, outcome: str, seconds: float, inputs: int, prompt_tokens: int
    ) -> None:
        """One Embed call's end: its duration by outcome, inputs, input tokens."""
        attrs: dict[str, str] = {**self._attrs, mn.MODEL: model, mn.OPERATION: "embeddings"}
        self.embed_duration.record(seconds, {**attrs, mn.OUTCOME: outcome})
        if outcome == "ok":
            self.embed_inputs.add(inputs, attrs)
            self.tokens.record(prompt_tokens, {**attrs, mn.TOKEN_TYPE: "input"})
