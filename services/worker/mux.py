"""The worker's side of ``GenerateMux``: many Generate streams over one call from an edge.

Why: on the one-call-per-stream path every token is its own gRPC message, and in Python a
message costs tens of microseconds of CPU at each end (grpc-aio's poller thread waking the
event loop, the Cython call path, a write), far more than the token's own work. Here every
stream that produced output during one turn of the event loop goes out in one ``MuxFrame``:
with vLLM, whose engine step hands every running request its tokens at once, that is one
message per engine step however many streams are running.

Each stream runs the unchanged ``Generate`` handler (admission, engine, telemetry, drain and
hand-off) with a :class:`StreamContext` standing in for gRPC's: its metadata is the open
message's, and where ``Generate`` would abort the call, the stream ends with a ``MuxEnd``
carrying the same status and trailers. A cancel message cancels the stream's task, as gRPC
cancels a handler whose call was cancelled.

Flow control per stream: a stream may have ``window`` chunks sent and not yet consumed by the
edge (credit messages grant more). A stream out of credit stops pulling from the engine, whose
output for it then merges until the edge reads again — one slow client slows only its own
stream, never the call that all the others share.

Backpressure from the writer: the per-stream window bounds a stream only while credit is
finite, and it is not once the edge half-closes (no credit can come, so none is needed) or
when a caller sends credit without reading. So the call as a whole is bounded too: events
queued and not yet written (``queued``) stop every stream from pulling more once they reach
``MAX_QUEUED_EVENTS`` (their engines merge what waits, as for a stream out of credit), and the
streams go on as the writer gets the call's frames out. A caller that never reads holds at
most that many events here, whatever its credits or its half-close say.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, NoReturn

import grpc

from meridian.v1 import worker_pb2
from services.common.grpcutil import Undecodable
from services.common.logs import event

log = logging.getLogger("meridian.worker.mux")

#: Chunks in flight per stream when the edge's open message names none.
DEFAULT_WINDOW = 256
#: The most chunks a stream may have in flight, whatever its open message or credits ask:
#: with it and ``MAX_STREAMS_PER_CALL``, what a call that never reads can queue is bounded.
MAX_WINDOW = 1024
#: Streams open on one call at most; another open is refused (RESOURCE_EXHAUSTED) for that
#: stream alone.
MAX_STREAMS_PER_CALL = 4096
#: Events in one frame at most.
MAX_EVENTS_PER_FRAME = 512
#: Bytes of chunks in one frame at most (a frame stays far below the 4 MiB message limit,
#: which cut the call and every stream on it): a chunk that does not fit starts the next
#: frame. One chunk is smaller than this (services.worker.split).
MAX_FRAME_BYTES = 1024 * 1024
#: Events queued on one call and not yet written at most: past it, streams wait for the
#: writer (a caller that stops reading, whose HTTP/2 window has filled, holds this many).
MAX_QUEUED_EVENTS = 8192
#: What an event adds to its chunk's bytes: its tags, lengths and stream id.
_EVENT_OVERHEAD_BYTES = 16

Handler = Callable[
    [worker_pb2.GenerateRequest, Any], AsyncGenerator[worker_pb2.GenerateChunk, None]
]


class StreamAborted(Exception):
    """``Generate`` ended its stream with an error status (what ``context.abort`` raises)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: dict[str, str]) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailers = trailers


class MuxProtocolError(Exception):
    """The caller broke the protocol (a stream id opened twice): the call ends with
    INVALID_ARGUMENT, since no answer under that id could be told from the live stream's."""


class StreamContext:
    """What ``Generate`` uses of a ``grpc.aio.ServicerContext``, for one multiplexed stream."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata
        self._trailers: dict[str, str] = {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._trailers = dict(metadata)

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: Any) -> NoReturn:
        raise StreamAborted(code, details, self._trailers)


class _Stream:
    __slots__ = ("credit", "has_credit", "task")

    def __init__(self, window: int) -> None:
        self.credit = window
        self.has_credit = asyncio.Event()
        self.has_credit.set()
        self.task: asyncio.Task[None] | None = None

    def grant(self, n: int) -> None:
        self.credit = min(self.credit + n, MAX_WINDOW)
        if self.credit > 0:
            self.has_credit.set()

    def unbounded(self) -> None:
        """No more credit can come (the edge half-closed): HTTP/2's own window paces it."""
        self.credit = sys.maxsize
        self.has_credit.set()

    async def wait_for_credit(self) -> None:
        """Until the edge grants more (called only when there is none: the per-chunk check
        stays inline, no coroutine per token)."""
        while self.credit <= 0:
            self.has_credit.clear()
            await self.has_credit.wait()


class MuxSession:
    """One ``GenerateMux`` call: reads open/cancel/credit messages, runs each stream, and
    writes what the streams produced, one frame per turn of the event loop."""

    def __init__(self, handler: Handler, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._handler = handler
        self._context = context
        self._streams: dict[int, _Stream] = {}
        self._frames: list[worker_pb2.MuxFrame] = []  # written in order; the last one fills
        self._filling_bytes = 0  # of the last frame in ``_frames``
        self._wake = asyncio.Event()
        self._room = asyncio.Event()  # set by the writer when ``queued`` falls below the cap
        self._room.set()
        self._max_queued = MAX_QUEUED_EVENTS
        #: Events in ``_frames`` or being written: what this call holds for its caller.
        self.queued = 0
        self._closed = False
        self._finishing = False  # no more requests: write what is left, then return
        self._shut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.frames = 0
        self.events = 0

    def shut(self) -> None:
        """The worker is stopping (its drain has ended or handed off every stream): read no
        more requests, write what the streams left (their last chunks and ends) and end the
        call with OK — the edge reads a clean end, not a call cut by the server's stop."""
        if not self._shut.done():
            self._shut.set_result(None)

    async def serve(self, requests: AsyncIterator[worker_pb2.MuxRequest]) -> None:
        writer = asyncio.create_task(self._write_frames())
        reader = asyncio.create_task(self._read_requests(requests))
        broken: MuxProtocolError | None = None
        try:
            await asyncio.wait((reader, self._shut), return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                reader.result()  # a broken protocol or a broken call raises here
            # The edge half-closed (it sends nothing more) or the worker is stopping: the
            # open streams still get their tokens and their MuxEnd, then the call ends OK.
            await self._finish(writer)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass  # the edge went away: its streams end with the call
        except MuxProtocolError as err:
            broken = err
        finally:
            self._closed = True
            reader.cancel()
            tasks = [s.task for s in self._streams.values() if s.task is not None]
            for task in tasks:
                task.cancel()
            writer.cancel()
            try:
                # These waits can be cut short (the handler cancelled while they run, as
                # when the client leaves while the writer is blocked): log the close anyway.
                await asyncio.gather(reader, *tasks, return_exceptions=True)
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await writer
            finally:
                event(log, "mux.closed", frames=self.frames, events=self.events)
        if broken is not None:
            await self._context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(broken))

    async def _read_requests(self, requests: AsyncIterator[worker_pb2.MuxRequest]) -> None:
        """Apply the edge's messages until it half-closes. A task of its own, so that a
        stopping worker can stop reading (:meth:`shut`) while a read is pending."""
        async for request in requests:
            self._apply(request)

    async def _finish(self, writer: asyncio.Task[None]) -> None:
        for stream in self._streams.values():
            stream.unbounded()
        tasks = [s.task for s in self._streams.values() if s.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        self._finishing = True
        self._wake.set()
        await writer

    def _apply(self, request: worker_pb2.MuxRequest | Undecodable) -> None:
        if isinstance(request, Undecodable):  # services/common/grpcutil.py
            raise MuxProtocolError(request.why)
        op = request.WhichOneof("op")
        if op == "open":
            if request.stream_id in self._streams:
                raise MuxProtocolError(
                    f"stream_id {request.stream_id} is already open on this call"
                )
            if len(self._streams) >= MAX_STREAMS_PER_CALL:
                self._emit_end(
                    request.stream_id,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"at most {MAX_STREAMS_PER_CALL} streams may be open on one call",
                    {},
                )
                return
            stream = _Stream(min(request.open.window or DEFAULT_WINDOW, MAX_WINDOW))
            self._streams[request.stream_id] = stream
            stream.task = asyncio.create_task(self._run(request.stream_id, request.open, stream))
        elif op == "cancel":
            live = self._streams.get(request.stream_id)
            # ``cancel`` is a bool: set to false, the message asks nothing (proto3 still
            # reports the oneof as set).
            if request.cancel and live is not None and live.task is not None:
                live.task.cancel()
        elif op == "credit":
            live = self._streams.get(request.stream_id)
            if live is not None:
                live.grant(request.credit)

    async def _run(self, stream_id: int, open_: worker_pb2.MuxOpen, stream: _Stream) -> None:
        context = StreamContext(tuple(open_.metadata.items()))
        try:
            async with contextlib.aclosing(self._handler(open_.request, context)) as chunks:
                async for chunk in chunks:
                    if stream.credit <= 0:
                        await stream.wait_for_credit()
                    stream.credit -= 1
                    if self.queued >= self._max_queued:
                        await self._wait_for_room()
                    self._event(stream_id, chunk.ByteSize()).chunk.CopyFrom(chunk)
            self._emit_end(stream_id, grpc.StatusCode.OK, "", {})
        except StreamAborted as aborted:
            self._emit_end(stream_id, aborted.code, aborted.details, aborted.trailers)
        except asyncio.CancelledError:
            pass  # cancelled by the edge (or the call ended): it expects nothing more
        except Exception as err:
            log.exception("mux stream %d failed", stream_id)
            self._emit_end(stream_id, grpc.StatusCode.INTERNAL, f"worker error: {err}", {})
        finally:
            self._streams.pop(stream_id, None)

    async def _wait_for_room(self) -> None:
        """Until the writer has got the queue below the cap (called only when it is at it:
        the per-chunk check stays inline)."""
        while self.queued >= self._max_queued:
            self._room.clear()
            await self._room.wait()

    def _event(self, stream_id: int, size: int = 0) -> worker_pb2.MuxEvent:
        """A new event of about ``size`` bytes for ``stream_id`` in the frame being filled
        (built in place: the chunk is copied once, into the frame that is written)."""
        frames = self._frames
        size += _EVENT_OVERHEAD_BYTES
        if (
            not frames
            or len(frames[-1].events) >= MAX_EVENTS_PER_FRAME
            or self._filling_bytes + size > MAX_FRAME_BYTES
        ):
            frames.append(worker_pb2.MuxFrame())
            self._filling_bytes = 0
        self._filling_bytes += size
        self._wake.set()
        self.queued += 1
        item: worker_pb2.MuxEvent = frames[-1].events.add(stream_id=stream_id)
        return item

    def _emit_end(
        self, stream_id: int, code: grpc.StatusCode, details: str, trailers: dict[str, str]
    ) -> None:
        end = self._event(stream_id).end
        end.code = code.value[0]
        end.details = details
        end.trailers.update(trailers)

    async def _write_frames(self) -> None:
        """One frame per wake-up with everything pending: the streams that produced output
        in the same turn of the loop share it, and while a write waits (the edge is behind)
        the next frame grows instead of the message count."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._frames:
                frame = self._frames.pop(0)
                count = len(frame.events)
                self.frames += 1
                self.events += count
                await self._context.write(frame)
                self.queued -= count
                if self.queued < self._max_queued:
                    self._room.set()
            if self._finishing:
                return
