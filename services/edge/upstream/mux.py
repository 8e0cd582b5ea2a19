"""The edge's side of ``GenerateMux``: every stream to one worker over one call.

The worker side (services/worker/mux.py) says why: one gRPC message per token costs more CPU
than the token's own work, and a worker that sends every stream's output of one engine step in
one frame turns N messages into one. Here one reader task per worker reads those frames and
hands each event to its stream; a stream is a :class:`MuxCall`, which offers the part of
``grpc.aio.UnaryStreamCall`` the edge uses (``read``, ``cancel``, ``done``) with the same
semantics — chunks, then ``grpc.aio.EOF``, or an ``AioRpcError`` with the status and trailers
the worker's Generate would have ended with — so failover, migration and the stream stage do
not know which transport they are on.

Failure: when the call breaks (the worker died, the connection dropped), every stream on it
fails as a broken Generate call would (UNAVAILABLE, no trailers: "lost the connection"), and
the next stream to that worker opens a new call. A worker that does not know GenerateMux
(UNIMPLEMENTED before any frame) has its streams carried on as Generate calls, and is used
over Generate for a while (the pool asks again later: it may have been upgraded).

Flow control: a stream lets the worker send ``window`` chunks ahead of what its reader has
consumed and grants more as it consumes, so a slow client's stream waits at the worker, not in
the edge's memory, and never holds up the other streams on the call.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common.logs import event
from services.edge.counters import EdgeCounters

log = logging.getLogger("meridian.edge.mux")

#: Chunks a stream lets the worker send ahead of its reader; credit goes back at half of it.
#: Large enough that a stream whose client keeps up never waits for credit (the grant's
#: round trip, on a loaded host tens of milliseconds, would show as inter-token gaps), small
#: enough to bound what one slow client's stream holds in the edge.
WINDOW = 256

MuxStub = grpc.aio.StreamStreamCall[worker_pb2.MuxRequest, worker_pb2.MuxFrame]

_LOST = "lost the connection to the worker mid-stream"


def _rpc_error(code: grpc.StatusCode, details: str, trailers: Any = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(*tuple(trailers)), details=details
    )


_STATUS = {c.value[0]: c for c in grpc.StatusCode}
_NOT_SUPPORTED = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL)


if TYPE_CHECKING:
    from services.edge.upstream.worker_pool import TokenCall

    #: Opens the same stream as a Generate call (a worker that has no GenerateMux).
    Fallback = Callable[[worker_pb2.GenerateRequest, tuple[tuple[str, str], ...]], TokenCall]


class MuxCall:
    """One stream on a :class:`MuxSession` (see the module docstring)."""

    __slots__ = (
        "_consumed",
        "_delegate",
        "_done",
        "_items",
        "_session",
        "_waiter",
        "metadata",
        "request",
        "stream_id",
    )

    def __init__(
        self,
        session: MuxSession,
        stream_id: int,
        request: worker_pb2.GenerateRequest,
        metadata: tuple[tuple[str, str], ...],
    ) -> None:
        self._session = session
        self.stream_id = stream_id
        self.request = request
        self.metadata = metadata
        self._delegate: TokenCall | None = None
        self._items: collections.deque[worker_pb2.MuxEvent | grpc.aio.AioRpcError] = (
            collections.deque()
        )
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._consumed = 0

    async def read(self) -> worker_pb2.GenerateChunk | Any:
        """The next chunk; ``grpc.aio.EOF`` after the last; raises ``AioRpcError`` with the
        worker's status, or ``asyncio.CancelledError`` once cancelled."""
        while not self._items:
            delegate = self._delegate  # the same stream as a Generate call (no GenerateMux)
            if delegate is not None:
                return await delegate.read()
            if self._done:
                raise asyncio.CancelledError
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if isinstance(item, grpc.aio.AioRpcError):
            self._done = True
            raise item
        if item.HasField("chunk"):
            self._consumed += 1
            if self._consumed >= WINDOW // 2:
                self._session.grant(self.stream_id, self._consumed)
                self._consumed = 0
            return item.chunk
        self._done = True
        end = item.end
        if end.code == 0:
            return grpc.aio.EOF
        raise _rpc_error(
            _STATUS.get(end.code, grpc.StatusCode.UNKNOWN), end.details, end.trailers.items()
        )

    def cancel(self) -> bool:
        """Abort the stream at the worker; a pending ``read`` raises CancelledError."""
        if self._delegate is not None:
            return self._delegate.cancel()
        if self._done:
            return False
        self._done = True
        self._session.cancel(self.stream_id)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.cancel()
        return True

    def done(self) -> bool:
        return self._delegate.done() if self._delegate is not None else self._done

    def _switch(self, delegate: TokenCall) -> None:
        """Go on as ``delegate`` (the same stream as a Generate call); nothing had arrived."""
        self._delegate = delegate
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _deliver(self, item: worker_pb2.MuxEvent | grpc.aio.AioRpcError) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class MuxSession:
    """One GenerateMux call to one worker, shared by every stream the edge sends it."""

    def __init__(
        self,
        stub: worker_pb2_grpc.WorkerStub,
        address: str,
        *,
        fallback: Fallback,
        counters: EdgeCounters,
    ) -> None:
        self.address = address
        self._fallback = fallback
        self._counters = counters
        counters.mux_calls_opened += 1
        self._call: MuxStub = stub.GenerateMux()
        self._calls: dict[int, MuxCall] = {}
        self._next_id = 1
        self._outbox: collections.deque[worker_pb2.MuxRequest] = collections.deque()
        self._wake = asyncio.Event()
        self.closed = False
        #: Set when the worker answered UNIMPLEMENTED: use Generate for it from now on.
        self.unsupported = False
        self._cancelled = False
        self._framed = False  # a frame arrived: the worker speaks GenerateMux
        self._reader = asyncio.create_task(self._read())
        self._writer = asyncio.create_task(self._write())

    def open(
        self, request: worker_pb2.GenerateRequest, metadata: tuple[tuple[str, str], ...]
    ) -> MuxCall:
        stream_id = self._next_id
        self._next_id += 1
        call = MuxCall(self, stream_id, request, metadata)
        self._calls[stream_id] = call
        message = worker_pb2.MuxRequest(stream_id=stream_id)
        message.open.request.CopyFrom(request)
        message.open.metadata.update(metadata)
        message.open.window = WINDOW
        self._send(message)
        return call

    def cancel(self, stream_id: int) -> None:
        if self._calls.pop(stream_id, None) is not None and not self.closed:
            self._send(worker_pb2.MuxRequest(stream_id=stream_id, cancel=True))

    def grant(self, stream_id: int, n: int) -> None:
        if not self.closed and stream_id in self._calls:
            self._send(worker_pb2.MuxRequest(stream_id=stream_id, credit=n))

    @property
    def streams(self) -> int:
        return len(self._calls)

    def _send(self, message: worker_pb2.MuxRequest) -> None:
        self._outbox.append(message)
        self._wake.set()

    async def _write(self) -> None:
        """The call's only writer (grpc-aio allows one write at a time)."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._outbox:
                    await self._call.write(self._outbox.popleft())
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the call is over: the reader fails the streams

    async def _read(self) -> None:
        try:
            while True:
                frame = await self._call.read()
                if not isinstance(frame, worker_pb2.MuxFrame):  # EOF: the worker closed it
                    break
                calls = self._calls
                self._framed = True
                self._counters.mux_frames += 1
                self._counters.mux_events += len(frame.events)
                for item in frame.events:
                    call = calls.get(item.stream_id)
                    if call is None:
                        continue  # cancelled here: the worker's last words for it
                    call._deliver(item)
                    if item.HasField("end"):
                        del calls[item.stream_id]
        except grpc.aio.AioRpcError as err:
            code = err.code()
            # An older worker ends the call with UNIMPLEMENTED before any frame — which the
            # client's core can report as INTERNAL when the open message raced the reset.
            if not self._framed and code in _NOT_SUPPORTED:
                # An older worker: its streams go on as Generate calls (nothing was sent on
                # this call: UNIMPLEMENTED comes before any frame), and so do later ones.
                self.unsupported = True
                self.closed = True
                calls, self._calls = self._calls, {}
                event(log, "mux.unsupported", worker=self.address, streams=len(calls))
                for call in calls.values():
                    call._switch(self._fallback(call.request, call.metadata))
                return
            if not self._cancelled:
                self._counters.mux_calls_broken += 1
                event(
                    log,
                    "mux.broken",
                    level=logging.WARNING,
                    worker=self.address,
                    streams=len(self._calls),
                    code=code.name,
                )
        except asyncio.CancelledError:
            pass
        finally:
            self.closed = True
            calls, self._calls = self._calls, {}
            for call in calls.values():
                call._deliver(_rpc_error(grpc.StatusCode.UNAVAILABLE, _LOST))

    async def close(self) -> None:
        self._cancelled = True
        self.closed = True
        self._call.cancel()
        for task in (self._reader, self._writer):
            task.cancel()
        for task in (self._reader, self._writer):
            with contextlib.suppress(asyncio.CancelledError):
                await task
