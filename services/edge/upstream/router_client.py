"""The edge's client for the router (decisions): ``RouterClient`` asks for a ranked list of
candidates and reports outcomes back without waiting for them (batched).

Route calls and outcome reports travel over one ``RouteStream`` per client (opened on the
first call, reopened after it breaks): a unary call costs the router more CPU in gRPC than
its decision, a message on an open stream about half as much, and the outcomes gathered since
the last message ride along with the next request instead of costing a call of their own
(bench/router_cpu.py). A router without RouteStream (UNIMPLEMENTED) is asked with unary
``Route`` and ``ReportOutcomes`` from then on, as is any client built with ``stream=False``.
Errors are the same either way: the router's own verdicts arrive in the stream's answer as
the status unary Route would have ended with; a stream that breaks, or an answer later than
``timeout_s``, is :class:`RouterUnreachable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import grpc

from meridian.v1 import router_pb2, router_pb2_grpc
from services.common.errors import MeridianError, Unavailable, from_grpc
from services.common.grpc_tls import GrpcTls
from services.common.grpcutil import channel_to
from services.common.logs import event
from services.common.tracecontext import inject_metadata

log = logging.getLogger("meridian.edge.upstream")


@dataclass(frozen=True, slots=True)
class RouteResult:
    decision_id: str
    candidates: tuple[router_pb2.Candidate, ...]
    explanation: str


class RouterUnreachable(Unavailable):
    """The router did not answer at all (connection refused, timeout): not a decision."""


class RouterLike(Protocol):
    """What the pipeline needs from a router: :class:`RouterClient`, or the edge's
    :class:`~services.edge.upstream.resilient_router.ResilientRouter` that falls back to the
    router's last view."""

    async def route(self, request: router_pb2.RouteRequest) -> RouteResult: ...

    async def list_models(self) -> router_pb2.ListModelsResponse: ...

    async def ready(self) -> bool: ...

    def report_outcome(self, report: router_pb2.OutcomeReport) -> None: ...


class RouterClient:
    """Route and ListModels/GetView calls; outcome reports are batched (see
    :meth:`report_outcome`)."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 2.0,
        outcome_flush_s: float = 0.02,
        max_outcome_batch: int = 512,
        stream: bool = True,
        tls: GrpcTls | None = None,
    ) -> None:
        self._channel = channel_to(address, tls)
        self._stub = router_pb2_grpc.RouterStub(self._channel)
        self._timeout_s = timeout_s
        self._outcome_flush_s = outcome_flush_s
        self._max_outcome_batch = max_outcome_batch
        self._outcomes: list[router_pb2.OutcomeReport] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._use_stream = stream
        self._wants_stream = stream
        self._stream_retry_at = 0.0  # when a router that had no RouteStream is asked again
        self._stream: _RouteStream | None = None

    async def route(self, request: router_pb2.RouteRequest) -> RouteResult:
        if self._wants_stream and not self._use_stream:
            self._use_stream = time.monotonic() >= self._stream_retry_at  # upgraded since?
        if self._use_stream:
            stream = self._stream
            if stream is None or stream.closed:
                stream = self._stream = _RouteStream(self._stub)
            outcomes = self._take_outcomes()
            try:
                resp = await stream.route(request, outcomes, self._timeout_s)
                return RouteResult(
                    decision_id=resp.decision_id,
                    candidates=tuple(resp.candidates),
                    explanation=resp.explanation,
                )
            except _StreamUnsupported:
                event(log, "router.stream_unsupported", level=logging.DEBUG)
                self._use_stream = False
                self._stream_retry_at = time.monotonic() + STREAM_RECHECK_S
                self._stream = None
                for report in outcomes:  # never sent: they leave with the unary batch
                    self.report_outcome(report)
        try:
            resp = await self._stub.Route(
                request, timeout=self._timeout_s, metadata=inject_metadata() or None
            )
        except grpc.aio.AioRpcError as err:
            raise _router_error(err) from None
        return RouteResult(
            decision_id=resp.decision_id,
            candidates=tuple(resp.candidates),
            explanation=resp.explanation,
        )

    async def list_models(self) -> router_pb2.ListModelsResponse:
        try:
            resp: router_pb2.ListModelsResponse = await self._stub.ListModels(
                router_pb2.ListModelsRequest(), timeout=self._timeout_s
            )
            return resp
        except grpc.aio.AioRpcError as err:
            raise _router_error(err) from None

    async def get_view(self) -> router_pb2.RouterView:
        try:
            view: router_pb2.RouterView = await self._stub.GetView(
                router_pb2.GetViewRequest(), timeout=self._timeout_s
            )
            return view
        except grpc.aio.AioRpcError as err:
            raise _router_error(err) from None

    async def watch_fleet(
        self, request: router_pb2.WatchFleetRequest
    ) -> AsyncIterator[router_pb2.FleetUpdate]:
        """The router's live feed for operators' consoles (services/edge/web/feed.py);
        cancelled with the iteration. Raises MeridianError when the router fails it."""
        call = self._stub.WatchFleet(request)
        try:
            async for update in call:
                yield update
        except grpc.aio.AioRpcError as err:
            raise _router_error(err) from None
        finally:
            call.cancel()

    async def explain_request(
        self, request: router_pb2.ExplainRequestQuery
    ) -> router_pb2.RequestExplanation:
        """The router's decisions for one request, explained (the chat page's "why")."""
        try:
            resp: router_pb2.RequestExplanation = await self._stub.ExplainRequest(
                request, timeout=self._timeout_s
            )
            return resp
        except grpc.aio.AioRpcError as err:
            raise _router_error(err) from None

    async def ready(self) -> bool:
        try:
            models = await self._stub.ListModels(router_pb2.ListModelsRequest(), timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        return len(models.models) > 0

    def report_outcome(self, report: router_pb2.OutcomeReport) -> None:
        """Fire and forget, batched: reports wait at most ``outcome_flush_s`` and leave in one
        ``ReportOutcomes`` call, so a busy edge makes one RPC per interval, not per request.
        The client's response never waits on the router."""
        self._outcomes.append(report)
        if len(self._outcomes) >= self._max_outcome_batch:
            self._flush()
        elif self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_later(self._outcome_flush_s, self._flush)

    def _take_outcomes(self) -> list[router_pb2.OutcomeReport]:
        """The outcomes waiting to leave (they go with the next Route message)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        taken, self._outcomes = self._outcomes, []
        return taken

    def _flush(self) -> None:
        outcomes = self._take_outcomes()
        if not outcomes:
            return
        stream = self._stream
        if stream is not None and stream.answered and not stream.closed:
            stream.send_outcomes(outcomes)
            return
        batch = router_pb2.OutcomeBatch(reports=outcomes)

        async def send() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._stub.ReportOutcomes(batch, timeout=self._timeout_s)

        task = asyncio.create_task(send())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        self._flush()
        if self._stream is not None:
            await self._stream.close(timeout_s=1.0)
            self._stream = None
        if self._background:
            await asyncio.wait(self._background, timeout=1.0)
        await self._channel.close(grace=None)


class _StreamUnsupported(Exception):
    """The router has no RouteStream (an older one): ask it with unary calls."""


_STATUS_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}
#: How long a router without RouteStream is asked with unary calls before the stream is tried
#: again (it may have been upgraded, or the refusal was a restart's race).
STREAM_RECHECK_S = 300.0


def _unreachable() -> RouterUnreachable:
    return RouterUnreachable("the router is unreachable; try again shortly", retry_after_s=1.0)


class _RouteStream:
    """One open RouteStream: messages out through a queue (one writer, as gRPC wants), and
    a reader task that hands each answer to the call waiting for its ``call_id``."""

    def __init__(self, stub: router_pb2_grpc.RouterStub) -> None:
        self.closed = False
        #: The router has answered on this stream: it has RouteStream, so outcomes sent alone
        #: on it are not lost to an UNIMPLEMENTED (until then they go as unary batches).
        self.answered = False
        self._queue: asyncio.Queue[router_pb2.RouteStreamRequest | None] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Future[router_pb2.RouteStreamResponse]] = {}
        self._ids = itertools.count(1)
        self._call = stub.RouteStream(self._messages())
        self._reader = asyncio.create_task(self._read(), name="router stream")

    async def _messages(self) -> AsyncIterator[router_pb2.RouteStreamRequest]:
        while (msg := await self._queue.get()) is not None:
            yield msg

    async def _read(self) -> None:
        failure: BaseException = _unreachable()
        try:
            async for answer in self._call:
                self.answered = True
                waiter = self._waiting.pop(answer.call_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(answer)
        except grpc.aio.AioRpcError as err:
            code = err.code()
            # Per-request errors travel in answers: the stream itself breaking means the
            # router is gone or unreachable — unless it never answered and said UNIMPLEMENTED
            # (an older router), which grpc-core can also report as INTERNAL when the first
            # message raced the reset: those calls go on as unary Routes.
            if not self.answered and code in (
                grpc.StatusCode.UNIMPLEMENTED,
                grpc.StatusCode.INTERNAL,
            ):
                failure = _StreamUnsupported()
            else:
                failure = _unreachable()
            event(log, "router.stream_failed", level=logging.DEBUG, code=code.name)
        finally:
            self.closed = True
            self._queue.put_nowait(None)
            waiting, self._waiting = self._waiting, {}
            for waiter in waiting.values():
                if not waiter.done():
                    waiter.set_exception(failure)

    async def route(
        self,
        request: router_pb2.RouteRequest,
        outcomes: list[router_pb2.OutcomeReport],
        timeout_s: float,
    ) -> router_pb2.RouteResponse:
        call_id = next(self._ids)
        waiter: asyncio.Future[router_pb2.RouteStreamResponse] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiting[call_id] = waiter
        self._queue.put_nowait(
            router_pb2.RouteStreamRequest(
                call_id=call_id,
                request=request,
                metadata=dict(inject_metadata()),
                outcomes=outcomes,
            )
        )
        try:
            async with asyncio.timeout(timeout_s):
                answer = await waiter
        except TimeoutError:
            event(log, "router.unreachable", level=logging.DEBUG, code="DEADLINE_EXCEEDED")
            raise _unreachable() from None
        finally:
            self._waiting.pop(call_id, None)
        if answer.code:
            code = _STATUS_BY_VALUE.get(answer.code, grpc.StatusCode.UNKNOWN)
            raise from_grpc(code, answer.message, tuple(answer.trailers.items()))
        return answer.response

    def send_outcomes(self, outcomes: list[router_pb2.OutcomeReport]) -> None:
        self._queue.put_nowait(router_pb2.RouteStreamRequest(outcomes=outcomes))

    async def close(self, *, timeout_s: float) -> None:
        """End the stream after what is queued (the router applies it before the stream
        ends), waiting at most ``timeout_s``."""
        self._queue.put_nowait(None)
        done, _ = await asyncio.wait({self._reader}, timeout=timeout_s)
        if not done:
            self._call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


def _router_error(err: grpc.aio.AioRpcError) -> MeridianError:
    code = err.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and not (
        err.trailing_metadata()
    ):
        event(log, "router.unreachable", level=logging.DEBUG, code=code.name)
        return RouterUnreachable("the router is unreachable; try again shortly", retry_after_s=1.0)
    return from_grpc(code, err.details(), err.trailing_metadata())
