"""The worker's gRPC service: Generate (token streaming), Describe, WatchLoad and Probe over one
:class:`~services.worker.engine.Engine`.

Lifecycle: the server listens while the engine loads (models report LOADING and health is
NOT_SERVING, so the router sends nothing); ``drain()`` stops new work (UNAVAILABLE), marks
models DRAINING in load reports at once, lets in-flight streams finish within a grace period and
then hands the rest back: the engine aborts them and each stream's last chunk says ``handoff``,
so the edge continues it on another worker (mid-stream migration) instead of ending it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common import metric_names as mn
from services.common.errors import (
    InvalidRequest,
    MeridianError,
    ModelNotFound,
    Overloaded,
    Unavailable,
)
from services.common.grpcutil import abort_with
from services.common.logs import event
from services.common.tracecontext import extract_metadata
from services.worker import convert
from services.worker.admissions import AdmissionLog
from services.worker.choices import UsageTotals, choice_requests, interleave
from services.worker.engine import Engine, EngineOutput, EngineRequest, FinishReason, ModelState
from services.worker.mux import MuxSession
from services.worker.observability import WorkerTelemetry
from services.worker.split import split_output, too_large

log = logging.getLogger("meridian.worker")

MIN_REPORT_INTERVAL_S = 0.02
MAX_REPORT_INTERVAL_S = 10.0
#: Load (running + waiting over batch capacity, or KV-cache use) from which a request ending
#: pushes a load report early. Routers refuse traffic near saturation (95-98 % by default), so
#: a worker they last saw nearly full is refused work it already has room for until its next
#: periodic report; below this load a stale report changes no decision.
EARLY_REPORT_LOAD = 0.9
#: WatchLoad streams open at once at most (``--max-load-watchers``): one per router replica
#: is the normal case, so this is routers × replicas with room to spare. One more is refused
#: (RESOURCE_EXHAUSTED): each stream is a report built and sent every interval, and 400 of
#: them took the event loop's probe latency from 2 ms to 95 ms.
MAX_LOAD_WATCHERS = 64


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(
        self,
        *,
        engine: Engine,
        worker_id: str,
        region: str,
        version: str = "0.1.0",
        report_interval_s: float = 0.1,
        early_report_load: float = EARLY_REPORT_LOAD,
        max_load_watchers: int = MAX_LOAD_WATCHERS,
        telemetry: WorkerTelemetry | None = None,
    ) -> None:
        if not 0.0 <= early_report_load <= 1.0:
            raise ValueError(f"early_report_load must be within [0, 1], got {early_report_load}")
        if max_load_watchers < 1:
            raise ValueError(f"max_load_watchers must be >= 1, got {max_load_watchers}")
        self._max_load_watchers = max_load_watchers
        self.load_watchers = 0
        self._engine = engine
        self.telemetry = telemetry or WorkerTelemetry()
        self._worker_id = worker_id
        self._region = region
        self._version = version
        self._report_interval_s = report_interval_s
        self._draining = False
        self._ready_since: dict[str, int] = {}  # model -> unix s it was first seen READY
        self._inflight: dict[str, asyncio.Task[object]] = {}
        #: The engine's ids of an in-flight request with n > 1 (``<id>#<i>``, choices.py):
        #: what the drain aborts for it. Absent for n == 1 (the engine's id is its own).
        self._choice_ids: dict[str, tuple[str, ...]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._admissions = AdmissionLog()
        self._changed = asyncio.Event()
        self._early_report_load = early_report_load
        self._reported_load = 0.0  # the load in the newest report sent
        self._early_report: asyncio.TimerHandle | None = None
        self._closing = False
        #: Handlers of the long-lived calls (WatchLoad, GenerateMux): ended by close_streams.
        self._streams: set[asyncio.Task[object]] = set()
        self._mux: set[MuxSession] = set()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def notify_state_change(self) -> None:
        """Push a load report to every watcher now (model loaded, draining...)."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _capacity_freed(self) -> None:
        """A request ended. If routers last saw this worker nearly full, tell them it has room
        without waiting for the next periodic report: one early report per
        ``MIN_REPORT_INTERVAL_S`` however many requests end (which also lets an engine's own
        counters catch up), and none on a worker that was not near saturation."""
        if self._early_report is not None or self._reported_load < self._early_report_load:
            return
        self._early_report = asyncio.get_running_loop().call_later(
            MIN_REPORT_INTERVAL_S, self._send_early_report
        )

    def _send_early_report(self) -> None:
        self._early_report = None
        self.notify_state_change()

    # --- RPCs -----------------------------------------------------------------------------

    async def Generate(
        self,
        request: worker_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        arrived = time.monotonic()
        # Started, not attached: the handler yields across awaits; the span is made current
        # only around the log lines (trace ids) and ended explicitly.
        span = self.telemetry.tracer.start_span(
            "worker.Generate",
            context=extract_metadata(context.invocation_metadata()),
            kind=SpanKind.SERVER,
            attributes={
                "meridian.request_id": request.request_id[:128],
                mn.MODEL: request.model[:256],
                mn.WORKER: self._worker_id,
                mn.REGION: self._region,
            },
        )
        try:
            self._admit(request.model)
            engine_request = convert.request_from_pb(request, traceparent=_traceparent(span))
            n = convert.choices_from_pb(request)
            if engine_request.request_id in self._inflight:
                raise InvalidRequest(
                    f"request_id {engine_request.request_id!r} is already running",
                    param="request_id",
                )
        except MeridianError as err:
            span.set_status(Status(StatusCode.ERROR, err.message))
            span.end()
            with trace.use_span(span, end_on_exit=False):
                event(log, "generate.rejected", request_id=request.request_id, reason=err.message)
            await abort_with(context, err)
            return
        task = asyncio.current_task()
        assert task is not None
        self._inflight[engine_request.request_id] = task
        self._admissions.admitted(request.decision_id[:128])
        self._idle.clear()
        first_at: float | None = None
        last_at: float | None = None
        queue_ms: float | None = None
        last: EngineOutput | None = None
        finish = "cancelled"
        totals = UsageTotals(choices=n)
        tool_calls = 0
        dropped = 0  # truncate_oldest: messages the engine left out (once, whatever n is)
        if engine_request.tools or n > 1 or engine_request.response_format.type != "text":
            span.set_attribute("meridian.n", n)
            span.set_attribute("meridian.tools.count", len(engine_request.tools))
            span.set_attribute("meridian.response_format", engine_request.response_format.type)
        requests = choice_requests(engine_request, n)
        if n > 1:
            self._choice_ids[engine_request.request_id] = tuple(r.request_id for r in requests)
        try:
            async with contextlib.aclosing(interleave(self._engine, requests)) as outputs:
                async for index, out in outputs:
                    last = out
                    if n > 1:
                        totals.add(index, out)
                    if out.tool_calls:
                        tool_calls += sum(1 for c in out.tool_calls if c.id)
                    if out.dropped_messages and not dropped:
                        dropped = out.dropped_messages
                        self._dropped(span, engine_request, dropped, out.prompt_tokens)
                    if out.text or out.token_ids:
                        last_at = time.monotonic()
                        if first_at is None:
                            first_at = last_at
                            queue_ms = out.queue_ms
                            span.add_event(
                                "first_token",
                                {
                                    "meridian.queue_ms": out.queue_ms or 0.0,
                                    "meridian.prefill_ms": out.prefill_ms or 0.0,
                                },
                            )
                    if out.finish_reason is FinishReason.ABORT:
                        # Nobody here cancelled it (a cancelled call is not read): the drain's
                        # grace ended or the engine is shutting down. Hand the stream back so
                        # the edge continues it on another worker instead of ending it.
                        out.handoff = True
                        span.add_event(
                            "handoff", {"gen_ai.usage.output_tokens": out.completion_tokens}
                        )
                    if out.finish_reason is not None:
                        finish = out.finish_reason.value
                    # An output past one message's size (an echoed prompt's logprobs, a
                    # long merged run of tokens with theirs) goes out in pieces.
                    for piece in split_output(out) if too_large(out) else (out,):
                        chunk = convert.chunk_to_pb(piece)
                        if n > 1:
                            chunk.index = index
                            chunk.usage.prompt_tokens = totals.prompt
                            chunk.usage.completion_tokens = totals.completion
                            chunk.usage.cached_prompt_tokens = totals.cached
                        yield chunk
        except MeridianError as err:
            finish = "error"
            span.set_status(Status(StatusCode.ERROR, err.message))
            await abort_with(context, err)
        finally:
            self._inflight.pop(engine_request.request_id, None)
            if n > 1:
                self._choice_ids.pop(engine_request.request_id, None)
            if not self._inflight:
                self._idle.set()
            self._capacity_freed()
            prompt_tokens = last.prompt_tokens if last else 0
            completion_tokens = last.completion_tokens if last else 0
            if n > 1:
                prompt_tokens, completion_tokens = totals.prompt, totals.completion
            if tool_calls:
                span.set_attribute("meridian.tool_calls", tool_calls)
                self.telemetry.record_tool_calls(model=engine_request.model, calls=tool_calls)
            self.telemetry.record(
                model=engine_request.model,
                finish=finish,
                arrived=arrived,
                first_token_at=first_at,
                last_token_at=last_at,
                queue_ms=queue_ms,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
            span.set_attribute(mn.FINISH, finish)
            span.set_attribute("gen_ai.usage.input_tokens", prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", completion_tokens)
            span.set_attribute("meridian.aborted", finish in ("cancelled", "abort"))
            with trace.use_span(span, end_on_exit=True):
                event(
                    log,
                    "generate.done",
                    request_id=engine_request.request_id,
                    model=engine_request.model,
                    finish=finish,
                    completion_tokens=completion_tokens,
                    ttft_ms=None if first_at is None else round((first_at - arrived) * 1000, 2),
                    duration_ms=round((time.monotonic() - arrived) * 1000, 2),
                )

    async def GenerateMux(
        self,
        requests: AsyncIterator[worker_pb2.MuxRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        """Many Generate streams over one call (services/worker/mux.py): each runs
        :meth:`Generate` unchanged; their chunks share one message per turn of the loop."""
        session = MuxSession(self.Generate, context)  # type: ignore[arg-type]
        if self._closing:
            session.shut()
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        self._mux.add(session)
        try:
            await session.serve(requests)
        finally:
            self._mux.discard(session)
            self._streams.discard(task)

    async def Embed(
        self,
        request: worker_pb2.EmbedRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_pb2.EmbedResponse:
        """One batch of inputs through the pooling model: no tokens to stream, no decode."""
        arrived = time.monotonic()
        span = self.telemetry.tracer.start_span(
            "worker.Embed",
            context=extract_metadata(context.invocation_metadata()),
            kind=SpanKind.SERVER,
            attributes={
                "meridian.request_id": request.request_id[:128],
                mn.MODEL: request.model[:256],
                mn.OPERATION: "embeddings",
                mn.WORKER: self._worker_id,
                mn.REGION: self._region,
                "meridian.inputs": len(request.inputs),
            },
        )
        outcome, tokens = "error", 0
        with trace.use_span(span, end_on_exit=True):
            try:
                self._admit(request.model)
                embed_request = convert.embed_request_from_pb(request)
                task = asyncio.current_task()
                assert task is not None
                if embed_request.request_id in self._inflight:
                    raise InvalidRequest(
                        f"request_id {embed_request.request_id!r} is already running",
                        param="request_id",
                    )
                self._inflight[embed_request.request_id] = task
                self._admissions.admitted(request.decision_id[:128])
                self._idle.clear()
                try:
                    result = await self._engine.embed(embed_request)
                finally:
                    self._inflight.pop(embed_request.request_id, None)
                    if not self._inflight:
                        self._idle.set()
                    self._capacity_freed()
                outcome, tokens = "ok", sum(result.prompt_tokens)
                span.set_attribute("gen_ai.usage.input_tokens", tokens)
                return convert.embed_result_to_pb(result)
            except MeridianError as err:
                span.set_status(Status(StatusCode.ERROR, err.message))
                event(log, "embed.rejected", request_id=request.request_id, reason=err.message)
                await abort_with(context, err)
                raise AssertionError("unreachable") from None
            except asyncio.CancelledError:
                outcome = "cancelled"
                raise
            finally:
                seconds = time.monotonic() - arrived
                self.telemetry.record_embed(
                    model=request.model[:256],
                    outcome=outcome,
                    seconds=seconds,
                    inputs=len(request.inputs),
                    prompt_tokens=tokens,
                )
                event(
                    log,
                    "embed.done",
                    request_id=request.request_id[:128],
                    model=request.model[:256],
                    outcome=outcome,
                    inputs=len(request.inputs),
                    prompt_tokens=tokens,
                    duration_ms=round(seconds * 1000, 2),
                )

    async def Describe(
        self,
        request: worker_pb2.DescribeRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(
            worker_id=self._worker_id,
            region=self._region,
            models=self._models_pb(),
            engine=self._engine.name,
            version=self._version,
        )

    async def WatchLoad(
        self,
        request: worker_pb2.WatchLoadRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_pb2.LoadReport]:
        if self.load_watchers >= self._max_load_watchers:
            await abort_with(
                context,
                Overloaded(
                    f"at most {self._max_load_watchers} WatchLoad streams may be open on this "
                    "worker (--max-load-watchers); retry later",
                    retry_after_s=5.0,
                ),
            )
        interval = request.interval_ms / 1000 if request.interval_ms else self._report_interval_s
        interval = min(max(interval, MIN_REPORT_INTERVAL_S), MAX_REPORT_INTERVAL_S)
        sequence = 0
        cursor = self._admissions.last_seq  # admissions before this stream are in its counts
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        self.load_watchers += 1
        try:
            while True:
                changed = self._changed
                report = self.load_report(sequence)
                report.admitted_decision_ids.extend(self._admissions.since(cursor))
                cursor = self._admissions.last_seq
                yield report
                if self._closing:
                    return  # the worker is stopping: that report was the last (status OK)
                sequence += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=interval)
        finally:
            self.load_watchers -= 1
            self._streams.discard(task)

    async def Probe(
        self,
        request: worker_pb2.ProbeRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_pb2.ProbeReply:
        return worker_pb2.ProbeReply(sent_unix_ns=request.sent_unix_ns, worker_id=self._worker_id)

    # --- state ----------------------------------------------------------------------------

    def load_report(self, sequence: int) -> worker_pb2.LoadReport:
        report = worker_pb2.LoadReport(
            worker_id=self._worker_id,
            region=self._region,
            sequence=sequence,
            sent_unix_ms=int(time.time() * 1000),
            models=self._models_pb(),
            draining=self._draining,
            reports_admissions=True,
        )
        load = self._engine.load()
        convert.load_to_pb(load, report)
        slots = (load.running + load.waiting) / load.max_running if load.max_running > 0 else 0.0
        self._reported_load = max(slots, load.kv_cache_usage)
        return report

    async def drain(self, grace_s: float) -> int:
        """Stop taking work, wait up to ``grace_s`` for in-flight streams, hand the rest back
        (engine abort → a last chunk with ``handoff``, which the edge migrates).

        Returns how many requests were handed back.
        """
        self._draining = True
        self.notify_state_change()
        event(log, "worker.draining", inflight=len(self._inflight), grace_s=grace_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace_s)
        leftover = list(self._inflight)
        for request_id in leftover:
            # Every choice of an n > 1 request is an engine request of its own: each is
            # aborted, so each ends with its handoff chunk and the call ends cleanly (such a
            # stream cannot migrate, and the edge ends it with an error saying so:
            # docs/migration.md) instead of being cut by the cancel below.
            for engine_id in self._choice_ids.get(request_id, (request_id,)):
                await self._engine.abort(engine_id)
        # Give the aborted streams a moment to send their final (ABORT) chunk.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 1.0)
        for task in list(self._inflight.values()):
            task.cancel()
        return len(leftover)

    async def close_streams(self, timeout_s: float) -> None:
        """End the long-lived calls with status OK, after the drain and before the gRPC
        server stops (``WorkerServer.stop``): each WatchLoad stream sends one last report (it
        says draining) and ends, each GenerateMux call writes what its streams left (their
        hand-offs and ends) and ends; one opened from now on ends at once. Waits up to
        ``timeout_s`` for them and for the handlers the drain cancelled.

        Left open, ``server.stop`` would cut them (every watcher sees UNAVAILABLE) and the
        process could exit before their cancelled handlers had finished, which gRPC reports
        as an error with a raw traceback on stderr."""
        self._closing = True
        streams = len(self._streams)
        for session in self._mux:
            session.shut()
        self.notify_state_change()  # wakes every WatchLoad stream
        await self.settle(timeout_s)
        event(log, "worker.streams_closed", streams=streams, left_open=len(self._streams))

    async def settle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for every handler still running to finish (after
        ``server.stop`` cancelled what was left, before the event loop closes)."""
        tasks = {*self._streams, *self._inflight.values()}
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    def _dropped(
        self, span: trace.Span, request: EngineRequest, dropped: int, prompt_tokens: int
    ) -> None:
        """The engine left the oldest ``dropped`` messages out to fit the context
        (``truncate_oldest``): said on the span, counted, and logged with the trace id."""
        span.set_attribute("meridian.prompt.dropped_messages", dropped)
        self.telemetry.record_dropped_messages(model=request.model, messages=dropped)
        with trace.use_span(span, end_on_exit=False):
            event(
                log,
                "generate.truncated",
                request_id=request.request_id,
                dropped_messages=dropped,
                kept_messages=len(request.messages) - dropped,
                prompt_tokens=prompt_tokens,
            )

    def _admit(self, model: str) -> None:
        if self._draining:
            raise Unavailable("worker is draining; retry on another worker")
        for m in self._engine.models():
            if m.name == model:
                if m.state is not ModelState.READY:
                    raise Unavailable(f"model {model!r} is {m.state.value} on this worker")
                return
        if model:
            raise ModelNotFound(f"model {model!r} is not served by this worker", param="model")

    def _models_pb(self) -> list[worker_pb2.ModelInfo]:
        out = []
        for m in self._engine.models():
            if m.state is ModelState.READY:
                # When it came up here: /v1/models' "created" (the earliest worker's).
                self._ready_since.setdefault(m.name, int(time.time()))
            created = self._ready_since.get(m.name, 0)
            out.append(convert.model_to_pb(m, draining=self._draining, created_unix_s=created))
        return out


def _traceparent(span: trace.Span) -> str:
    """The W3C ``traceparent`` of ``span`` ("" for a non-recording, invalid one)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
