"""Open a token stream on the best worker that will actually produce a first token.

The router's ranked candidates are tried in order. A worker that fails *before its first
token* (connection refused, draining, overloaded, crashed, too slow to start) costs the client
nothing: the next candidate is tried, and when the list runs out the router is asked once more
(``reroute``) with the tried workers excluded. Errors that no other worker would fix (a bad
request) end the attempt at once. After the first token the stream belongs to that worker;
a failure then is the migration driver's (services/edge/migration/driver.py): it moves the
stream to another worker, or reports the failure to the client as a stream error.

Every attempt's outcome is reported to the router (fire and forget, batched by the router
client): it releases the request's in-flight slot at once (short requests would otherwise count
as in flight until a load report covers them) and feeds failure ejection.

Each attempt is a CLIENT span ``edge.attempt`` (worker, region, attempt number) whose context
travels in the Generate call's metadata, so the worker's span is its child; the first token is
an event on it, and the span ends with the stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from meridian.v1 import router_pb2, worker_pb2
from meridian.v1.router_pb2 import Outcome
from services.common import metric_names as mn
from services.common.errors import (
    MeridianError,
    Unavailable,
    UpstreamFailed,
    UpstreamTimeout,
    from_grpc,
    is_retryable_elsewhere,
)
from services.common.logs import event
from services.common.tracecontext import inject_metadata
from services.edge.context import Reroute
from services.edge.upstream.router_client import RouteResult
from services.edge.upstream.worker_pool import TokenCall, WorkerPool

T = TypeVar("T")

log = logging.getLogger("meridian.edge.failover")


@dataclass(frozen=True, slots=True, kw_only=True)
class FailoverPolicy:
    max_attempts: int = 3
    first_token_timeout_s: float = 60.0
    stream_idle_timeout_s: float = 120.0
    reroute: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if not self.first_token_timeout_s > 0 or not self.stream_idle_timeout_s > 0:
            raise ValueError("timeouts must be > 0")


class UpstreamStream:
    """A live Generate call whose first chunk has already arrived."""

    def __init__(
        self,
        *,
        call: TokenCall,
        first: worker_pb2.GenerateChunk,
        request_id: str,
        candidate: router_pb2.Candidate,
        decision_id: str,
        attempts: int,
        outcomes: OutcomeSink,
        idle_timeout_s: float,
        started: float,
        span: trace.Span,
        choices: int = 1,
    ) -> None:
        self._call = call
        self._choices = choices
        self._finished = 0
        self._span = span
        self.first = first
        #: This attempt's request id (the worker's engine request id).
        self.request_id = request_id
        self.candidate = candidate
        self.decision_id = decision_id
        self.attempts = attempts
        self._outcomes = outcomes
        self._idle_timeout_s = idle_timeout_s
        self.first_token_at = self.last_token_at = time.monotonic()
        self.ttft_ms = (self.first_token_at - started) * 1000
        self._reported = False
        self.completion_tokens = 0
        self._last_read = self.first_token_at
        self._idle_expired = False
        self._watchdog: asyncio.TimerHandle | None = None
        span.add_event("first_token", {"meridian.ttft_ms": self.ttft_ms})

    async def chunks(self) -> AsyncIterator[worker_pb2.GenerateChunk]:
        """The first chunk, then the rest; raises MeridianError if the worker fails midway.

        The idle limit is one watchdog timer per stream that re-arms itself from the time of
        the last chunk, not a timer per chunk: this loop runs once per token.
        """
        chunk = self.first
        watchdog = asyncio.get_running_loop().call_later(self._idle_timeout_s, self._check_idle)
        try:
            while True:
                self.completion_tokens = chunk.usage.completion_tokens
                if chunk.text:
                    self.last_token_at = self._last_read
                yield chunk
                if chunk.finish_reason != worker_pb2.FINISH_REASON_UNSPECIFIED:
                    # With n > 1 each choice finishes on its own; the stream ends with the last.
                    # A handed-back stream (drain, shutdown) is the worker declining to go on,
                    # not a failure: failure ejection learns from OUTCOME_FAILED only.
                    aborted = chunk.finish_reason == worker_pb2.FINISH_REASON_ABORT
                    self._finished += 1
                    if aborted or self._finished >= self._choices:
                        self._report(
                            router_pb2.OUTCOME_REJECTED if aborted else router_pb2.OUTCOME_SUCCESS
                        )
                        return
                try:
                    nxt = await self._call.read()
                except grpc.aio.AioRpcError as err:
                    self._report(router_pb2.OUTCOME_FAILED)
                    if self._idle_expired:
                        raise UpstreamTimeout("the worker stopped sending tokens") from None
                    raise _stream_error(err) from None
                except asyncio.CancelledError:
                    if self._idle_expired:
                        self._report(router_pb2.OUTCOME_FAILED)
                        raise UpstreamTimeout("the worker stopped sending tokens") from None
                    raise
                self._last_read = time.monotonic()
                if not isinstance(nxt, worker_pb2.GenerateChunk):  # grpc.aio.EOF
                    self._report(router_pb2.OUTCOME_FAILED)
                    raise UpstreamFailed("the worker ended the stream without a finish reason")
                chunk = nxt
        finally:
            watchdog.cancel()
            if self._watchdog is not None:
                self._watchdog.cancel()

    def _check_idle(self) -> None:
        """Re-arm from the last chunk; past the limit, cancel the call (read() then raises)."""
        idle = time.monotonic() - self._last_read
        if idle >= self._idle_timeout_s:
            self._idle_expired = True
            self._call.cancel()
            return
        loop = asyncio.get_running_loop()
        self._watchdog = loop.call_later(self._idle_timeout_s - idle, self._check_idle)

    def cancel(self) -> None:
        """Cancel the worker call (client went away); the worker aborts the generation."""
        if not self._call.done():
            self._call.cancel()
        self._report(router_pb2.OUTCOME_CANCELLED)

    def _report(self, outcome: Outcome) -> None:
        if self._reported:
            return
        self._reported = True
        self._span.set_attribute("gen_ai.usage.output_tokens", self.completion_tokens)
        self._span.set_attribute(mn.OUTCOME, router_pb2.Outcome.Name(outcome))
        if outcome == router_pb2.OUTCOME_FAILED:
            self._span.set_status(Status(StatusCode.ERROR, "worker failed mid-stream"))
        self._outcomes.report_outcome(
            router_pb2.OutcomeReport(
                decision_id=self.decision_id,
                worker_id=self.candidate.worker_id,
                outcome=outcome,
                ttft_ms=self.ttft_ms,
                completion_tokens=self.completion_tokens,
            )
        )
        self._span.end()


def _stream_error(err: grpc.aio.AioRpcError) -> MeridianError:
    if err.code() == grpc.StatusCode.UNAVAILABLE and not err.trailing_metadata():
        return UpstreamFailed("lost the connection to the worker mid-stream")
    return from_grpc(err.code(), err.details(), err.trailing_metadata())


class OutcomeSink(Protocol):
    """Where attempt outcomes go (the router, batched and fire-and-forget)."""

    def report_outcome(self, report: router_pb2.OutcomeReport) -> None: ...


#: The Generate request of one attempt: ``(request_id, decision_id) -> fresh proto``
#: (services/edge/upstream/protos.generate_request, bound to the request).
GenerateFactory = Callable[[str, str], worker_pb2.GenerateRequest]


async def over_candidates(
    *,
    first_route: RouteResult,
    reroute: Reroute,
    request_id: str,
    policy: FailoverPolicy,
    attempt: Callable[[router_pb2.Candidate, str, str, int], Awaitable[T]],
    what: str,
) -> T:
    """The failover loop every endpoint shares: ``attempt(candidate, attempt_id,
    decision_id, attempts)`` on each ranked candidate in turn (each worker once, at most
    ``policy.max_attempts``), asking ``reroute`` for a new ranking without the tried workers
    when a ranking runs out. An error another worker could avoid moves on to the next; any
    other propagates. The first attempt runs under ``request_id``, retries as
    ``request_id.N``. All tried: Unavailable, "no worker could {what}"."""
    tried: list[str] = []
    last_error: MeridianError | None = None
    route = first_route
    while True:
        for cand in route.candidates:
            if len(tried) >= policy.max_attempts:
                break
            if cand.worker_id in tried:
                continue
            tried.append(cand.worker_id)
            attempt_id = request_id if len(tried) == 1 else f"{request_id}.{len(tried)}"
            try:
                return await attempt(cand, attempt_id, route.decision_id, len(tried))
            except MeridianError as err:
                if not is_retryable_elsewhere(err):
                    raise
                last_error = err
                event(
                    log,
                    "attempt.failed",
                    level=logging.WARNING,
                    request_id=request_id,
                    worker_id=cand.worker_id,
                    region=cand.region,
                    error=err.message,
                )
        if not policy.reroute or len(tried) >= policy.max_attempts:
            break
        try:
            route = await reroute(tuple(tried))
        except MeridianError as err:
            last_error = last_error or err
            break
        if not route.candidates:
            break
    raise Unavailable(
        f"no worker could {what}" + (f"; last error: {last_error.message}" if last_error else ""),
        retry_after_s=1.0,
    )


async def open_stream(
    *,
    first_route: RouteResult,
    reroute: Reroute,
    outcomes: OutcomeSink,
    workers: WorkerPool,
    request_id: str,
    generate: GenerateFactory,
    policy: FailoverPolicy,
    tracer: trace.Tracer | None = None,
    choices: int = 1,
) -> UpstreamStream:
    """Try candidates until one produces a first token; see the module docstring.

    Flow is one way: the route stage's ranking comes in, new rankings come from ``reroute``
    (never by editing a request someone else built), and each attempt gets a fresh Generate
    request from ``generate`` — the first under ``request_id``, retries as
    ``request_id.N`` (:func:`over_candidates`)."""
    started = time.monotonic()

    def attempt(
        cand: router_pb2.Candidate, attempt_id: str, decision_id: str, attempts: int
    ) -> Awaitable[UpstreamStream]:
        return _attempt(
            outcomes=outcomes,
            workers=workers,
            cand=cand,
            decision_id=decision_id,
            generate=generate(attempt_id, decision_id),
            request_id=attempt_id,
            policy=policy,
            attempts=attempts,
            started=started,
            tracer=tracer or _NO_TRACER,
            choices=choices,
        )

    return await over_candidates(
        first_route=first_route,
        reroute=reroute,
        request_id=request_id,
        policy=policy,
        attempt=attempt,
        what="start this request",
    )


async def _attempt(
    *,
    outcomes: OutcomeSink,
    workers: WorkerPool,
    cand: router_pb2.Candidate,
    decision_id: str,
    generate: worker_pb2.GenerateRequest,
    request_id: str,
    policy: FailoverPolicy,
    attempts: int,
    started: float,
    tracer: trace.Tracer,
    choices: int = 1,
) -> UpstreamStream:
    span, metadata = attempt_span(tracer, cand, attempts)
    call = workers.generate(cand.address, generate, timeout_s=None, metadata=metadata)
    # What to tell the router if this attempt does not become a stream.
    outcome: Outcome = router_pb2.OUTCOME_CANCELLED
    failed = True
    try:
        first = await asyncio.wait_for(call.read(), policy.first_token_timeout_s)
        if not isinstance(first, worker_pb2.GenerateChunk):  # grpc.aio.EOF
            outcome = router_pb2.OUTCOME_FAILED
            raise UpstreamFailed("the worker ended the stream before the first token")
        failed = False  # from here on the stream reports its own outcome and ends the span
        return UpstreamStream(
            call=call,
            first=first,
            request_id=request_id,
            candidate=cand,
            decision_id=decision_id,
            attempts=attempts,
            outcomes=outcomes,
            idle_timeout_s=policy.stream_idle_timeout_s,
            started=started,
            span=span,
            choices=choices,
        )
    except TimeoutError:
        outcome = router_pb2.OUTCOME_FAILED
        raise UpstreamTimeout("the worker did not produce a first token in time") from None
    except grpc.aio.AioRpcError as err:
        mapped = _stream_error(err)
        outcome = error_outcome(err, mapped)
        span.set_attribute("rpc.grpc.status_code", err.code().value[0])
        raise mapped from None
    finally:
        if failed:
            call.cancel()
            span.set_status(Status(StatusCode.ERROR))
            span.end()
            outcomes.report_outcome(
                router_pb2.OutcomeReport(
                    decision_id=decision_id, worker_id=cand.worker_id, outcome=outcome
                )
            )


_REFUSALS = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)


def attempt_span(
    tracer: trace.Tracer, cand: router_pb2.Candidate, attempts: int, **attributes: str
) -> tuple[trace.Span, tuple[tuple[str, str], ...]]:
    """The CLIENT span ``edge.attempt`` of one attempt on ``cand`` (and ``attributes``), and
    the call metadata that carries its context to the worker.

    An unsampled request records nothing, but the worker must still get the trace context
    (with its "not sampled" flag) so that it does not start a trace of its own."""
    request_span = trace.get_current_span()
    span: trace.Span
    if request_span.is_recording():
        span = tracer.start_span(
            "edge.attempt",
            kind=SpanKind.CLIENT,
            attributes={
                mn.WORKER: cand.worker_id,
                mn.REGION: cand.region,
                **attributes,
                "meridian.attempt": attempts,
                "server.address": cand.address,
            },
        )
    else:
        span = trace.NonRecordingSpan(request_span.get_span_context())
    return span, inject_metadata(trace.set_span_in_context(span))


def error_outcome(err: grpc.aio.AioRpcError, mapped: MeridianError) -> Outcome:
    """What to tell the router about an attempt that ended with ``err`` (``mapped``): the
    request's own fault (no other worker would do better) is not the worker's; a refusal with
    Meridian's trailers (busy, draining) is a rejection; anything else is a failure."""
    if not is_retryable_elsewhere(mapped):
        return router_pb2.OUTCOME_CANCELLED
    if err.trailing_metadata() and err.code() in _REFUSALS:
        return router_pb2.OUTCOME_REJECTED
    return router_pb2.OUTCOME_FAILED


_NO_TRACER = trace.NoOpTracer()
