"""``MigratingStream``: the chunk iterator the stream stage reads, moving the stream to
another worker when its worker breaks after the first token.

A break is a mid-stream error that another worker could fix (the connection dropped, the
call failed, nothing for ``stall_s``: :func:`~services.common.errors.is_retryable_elsewhere`
or an internal error) or a chunk that hands the stream back (``handoff``, or any
``FINISH_REASON_ABORT``: a drained or shutting-down worker). Then, unless the request is
refused (:func:`~services.edge.migration.refusal.migration_refusal`, migration off) or a bound
of :class:`~services.edge.migration.policy.MigrationPolicy` is reached:

1. the failed worker joins the stream's exclusions and the router is asked again (``reroute``,
   so the tenant's residency and every filter still apply);
2. :func:`~services.edge.upstream.failover.open_stream` tries the new candidates with the
   original request plus the resume state (``delivered`` token ids, text length and tail,
   the origin attempt's id) — the whole migration bounded by what is left of ``max_gap_s``;
3. the new worker's chunks continue the same client stream. Its usage is the original
   request's (prompt tokens, all completion tokens), so the final usage and the rate-limit
   settlement count every token once.

The aborted chunk of a handed-back stream is never shown to the client (its text may be a
held-back stop-string start; the new worker sends it again), so ``FINISH_REASON_ABORT`` never
reaches a client. Cancellation: every wait here is the handler's own task, so a client that
leaves cancels the reroute or the new attempt (whose ``finally`` cancels its call), and
:meth:`MigratingStream.cancel` cancels the live one.

Each migration is an ``edge.migration`` span (trigger, old and new worker and region, tokens
carried, the gap the client saw), a ``stream.migrated`` / ``stream.migration_failed`` log line
and metrics by trigger and outcome (services/edge/observability.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from meridian.v1 import worker_pb2
from services.common import metric_names as mn
from services.common.errors import (
    InternalError,
    MeridianError,
    UpstreamFailed,
    UpstreamTimeout,
    is_retryable_elsewhere,
)
from services.common.logs import event
from services.edge.context import Reroute
from services.edge.migration.policy import MigrationPolicy
from services.edge.migration.resume import Delivered, with_resume
from services.edge.migration.triggers import Outcome, Trigger, trigger_of
from services.edge.upstream.failover import (
    FailoverPolicy,
    GenerateFactory,
    OutcomeSink,
    UpstreamStream,
    open_stream,
)
from services.edge.upstream.router_client import RouteResult
from services.edge.upstream.worker_pool import WorkerPool

log = logging.getLogger("meridian.edge.migration")

#: Where each migration's trigger, outcome and gap go (EdgeTelemetry.record_migration).
MigrationRecorder = Callable[[Trigger, Outcome, float | None], None]


class _HandedBack(Exception):
    """The worker ended the stream with FINISH_REASON_ABORT (drain, engine shutdown)."""


def _migratable(err: MeridianError) -> bool:
    return is_retryable_elsewhere(err) or isinstance(err, InternalError)


class MigratingStream:
    """The chunks of one client stream across however many workers it takes."""

    def __init__(
        self,
        *,
        first: UpstreamStream,
        request_id: str,
        refusal: str | None,
        policy: MigrationPolicy,
        failover: FailoverPolicy,
        reroute: Reroute,
        outcomes: OutcomeSink,
        workers: WorkerPool,
        generate: GenerateFactory,
        record: MigrationRecorder,
        tracer: trace.Tracer,
    ) -> None:
        self.current = first
        #: When the client got its first token (the first worker's), and how long it took.
        self.first_token_at = first.first_token_at
        self.ttft_ms = first.ttft_ms
        self.migrations = 0
        self.delivered = Delivered()
        self._request_id = request_id
        self._origin_request_id = first.request_id
        self._refusal = refusal
        self._policy = policy
        self._failover = failover
        self._reroute = reroute
        self._outcomes = outcomes
        self._workers = workers
        self._generate = generate
        self._record = record
        self._tracer = tracer
        self._excluded: list[str] = []
        self._last_token_at = first.first_token_at

    async def chunks(self) -> AsyncGenerator[worker_pb2.GenerateChunk, None]:
        """Every chunk the client should see, in order, the last with a finish reason (never
        ``FINISH_REASON_ABORT``); raises MeridianError when the stream cannot go on."""
        while True:
            upstream = self.current
            try:
                async for chunk in upstream.chunks():
                    if chunk.finish_reason == worker_pb2.FINISH_REASON_ABORT:
                        raise _HandedBack
                    self.delivered.add(chunk)
                    yield chunk
                return
            except _HandedBack:
                trigger = Trigger.HANDOFF
                error: MeridianError = UpstreamFailed(
                    "the worker stopped this stream (drain or shutdown) before it finished"
                )
            except MeridianError as err:
                if not _migratable(err):
                    raise
                trigger, error = trigger_of(err), err
            upstream.cancel()
            self._last_token_at = upstream.last_token_at
            self.current = await self._migrate(trigger, error, upstream)

    def cancel(self) -> None:
        """Cancel the live worker call (the client left, or the stream ended)."""
        self.current.cancel()

    async def _migrate(
        self, trigger: Trigger, error: MeridianError, old: UpstreamStream
    ) -> UpstreamStream:
        policy = self._policy
        refused = self._refused(error)
        if refused is not None:
            outcome, reason = refused
            self._give_up(trigger, outcome, old, reason)
            raise UpstreamFailed(f"{error.message}; {reason}")
        budget = policy.max_gap_s - (time.monotonic() - self._last_token_at)
        if budget <= 0:
            reason = f"no token for {policy.max_gap_s:g} s (--migration-max-gap-s)"
            self._give_up(trigger, Outcome.EXHAUSTED, old, reason)
            raise UpstreamTimeout(f"{error.message}; {reason}")
        self._excluded.append(old.candidate.worker_id)
        self.migrations += 1
        number = self.migrations
        carried = len(self.delivered.token_ids)
        span = self._tracer.start_span(
            "edge.migration",
            attributes={
                "meridian.migration.trigger": trigger.value,
                "meridian.migration.number": number,
                "meridian.migration.tokens_carried": carried,
                "meridian.migration.from_worker": old.candidate.worker_id,
                "meridian.migration.from_region": old.candidate.region,
            },
        )
        try:
            with trace.use_span(span, end_on_exit=False):  # the new attempts are its children
                async with asyncio.timeout(budget):
                    new = await self._open(number)
        except TimeoutError:
            reason = f"no worker continued it within {policy.max_gap_s:g} s"
            self._end_span(span, Outcome.EXHAUSTED, reason)
            self._give_up(trigger, Outcome.EXHAUSTED, old, reason)
            raise UpstreamTimeout(f"{error.message}; {reason}") from None
        except MeridianError as err:
            reason = f"no worker could continue it: {err.message}"
            self._end_span(span, Outcome.FAILED, reason)
            self._give_up(trigger, Outcome.FAILED, old, reason)
            raise UpstreamFailed(f"{error.message}; {reason}") from None
        except asyncio.CancelledError:
            self._end_span(span, Outcome.CANCELLED, "the client left")
            self._record(trigger, Outcome.CANCELLED, None)
            raise
        gap_s = new.first_token_at - self._last_token_at
        span.set_attribute("meridian.migration.to_worker", new.candidate.worker_id)
        span.set_attribute("meridian.migration.to_region", new.candidate.region)
        span.set_attribute("meridian.migration.gap_ms", round(gap_s * 1000, 2))
        self._end_span(span, Outcome.MIGRATED, None)
        self._record(trigger, Outcome.MIGRATED, gap_s)
        event(
            log,
            "stream.migrated",
            request_id=self._request_id,
            trigger=trigger.value,
            migration=number,
            from_worker=old.candidate.worker_id,
            from_region=old.candidate.region,
            to_worker=new.candidate.worker_id,
            to_region=new.candidate.region,
            tokens_carried=carried,
            gap_ms=round(gap_s * 1000, 2),
            error=error.message,
        )
        return new

    def _refused(self, error: MeridianError) -> tuple[Outcome, str] | None:
        policy = self._policy
        if not policy.enabled:
            return Outcome.REFUSED, "mid-stream migration is off on this edge"
        if self._refusal is not None:
            return Outcome.REFUSED, self._refusal
        if self.migrations >= policy.max_migrations:
            return (
                Outcome.EXHAUSTED,
                f"the stream already moved {self.migrations} times (--migration-max-attempts)",
            )
        if len(self.delivered.token_ids) > policy.max_resumable_tokens:
            return (
                Outcome.EXHAUSTED,
                f"{len(self.delivered.token_ids)} tokens delivered, over the "
                f"{policy.max_resumable_tokens} that can be resumed (--migration-max-tokens)",
            )
        return None

    async def _open(self, number: int) -> UpstreamStream:
        excluded = tuple(self._excluded)
        reroute = self._reroute
        delivered = self.delivered
        origin = self._origin_request_id

        async def reroute_more(more: Sequence[str]) -> RouteResult:
            return await reroute((*excluded, *more))

        def generate(request_id: str, decision_id: str) -> worker_pb2.GenerateRequest:
            return with_resume(
                self._generate(request_id, decision_id),
                delivered,
                origin_request_id=origin,
                migrations=number,
            )

        route = await reroute(excluded)
        return await open_stream(
            first_route=route,
            reroute=reroute_more,
            outcomes=self._outcomes,
            workers=self._workers,
            request_id=f"{self._request_id}.m{number}",
            generate=generate,
            policy=self._failover,
            tracer=self._tracer,
        )

    def _end_span(self, span: trace.Span, outcome: Outcome, reason: str | None) -> None:
        span.set_attribute(mn.OUTCOME, outcome.value)
        if reason is not None and outcome is not Outcome.CANCELLED:
            span.set_status(Status(StatusCode.ERROR, reason))
        span.end()

    def _give_up(
        self, trigger: Trigger, outcome: Outcome, old: UpstreamStream, reason: str
    ) -> None:
        self._record(trigger, outcome, None)
        event(
            log,
            "stream.migration_failed",
            level=logging.WARNING,
            request_id=self._request_id,
            trigger=trigger.value,
            outcome=outcome.value,
            worker_id=old.candidate.worker_id,
            region=old.candidate.region,
            tokens_delivered=len(self.delivered.token_ids),
            reason=reason,
        )
