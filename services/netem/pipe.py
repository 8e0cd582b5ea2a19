"""One direction of one proxied connection: read, timestamp, hold, write.

A reader task reads chunks as fast as the source sends them, asks the
:class:`~services.netem.link.LinkSchedule` when each may leave, and queues it; a writer task
sleeps until the head chunk's release time, writes it and every later chunk that is also due,
then ``drain()``\\s. Because reading never waits for the delay, many chunks are in flight at
once and only latency grows, not the time per chunk.

Backpressure: the queue is bounded in bytes (``max_in_flight_bytes``, the emulated link's
bandwidth-delay product). When it is full the reader stops reading, the kernel's receive
window fills and the sender blocks, just as on a real link; ``drain()`` does the same on the
write side when the destination reads slowly.

End of stream travels in order and with the same delay as data: EOF from the source becomes
``write_eof()`` on the destination (TCP half-close) once every byte before it was written.
A read error (the source reset) ends the pipe with ``PipeEnd.RESET``; the connection then
resets both sides.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from services.common.clock import SYSTEM_CLOCK, Clock
from services.netem.link import LinkSchedule

READ_CHUNK_BYTES = 64 * 1024


class PipeEnd(enum.Enum):
    EOF = "eof"  # the source half-closed; the destination got write_eof()
    RESET = "reset"  # either side failed; the connection must be torn down


@dataclass(frozen=True, slots=True)
class _Item:
    release: float
    data: bytes  # b"" marks EOF


class _ByteBoundedQueue:
    """FIFO of chunks holding at most ``max_bytes`` of payload (one oversize chunk may enter an
    empty queue, so a chunk larger than the bound cannot deadlock the pipe)."""

    def __init__(self, max_bytes: int) -> None:
        self._items: deque[_Item] = deque()
        self._bytes = 0
        self._max = max_bytes
        self._changed = asyncio.Condition()

    async def put(self, item: _Item) -> None:
        size = len(item.data)
        async with self._changed:
            await self._changed.wait_for(lambda: not self._items or self._bytes + size <= self._max)
            self._items.append(item)
            self._bytes += size
            self._changed.notify_all()

    async def peek(self) -> _Item:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            return self._items[0]

    def head_due(self, now: float) -> _Item | None:
        """The head item if it is due at ``now`` (without removing it)."""
        if self._items and self._items[0].release <= now:
            return self._items[0]
        return None

    async def pop(self) -> None:
        async with self._changed:
            item = self._items.popleft()
            self._bytes -= len(item.data)
            self._changed.notify_all()


class Pipe:
    """Forward ``source`` to ``sink`` through ``schedule``.

    ``gate`` is the proxy's "link is up" event: while it is clear (a cut in stall mode) nothing
    is written, and the bytes wait as they would in a real partition. ``on_bytes`` is told how
    many bytes were delivered (the proxy's counters). ``clock`` timestamps chunks and decides
    when they are due; the event loop's own clock is not used because its timers may fire
    early by up to its resolution, and the delay must be a floor.
    """

    def __init__(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        *,
        schedule: LinkSchedule,
        gate: asyncio.Event,
        on_bytes: Callable[[int], None],
        max_in_flight_bytes: int,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._clock = clock
        self._source = source
        self._sink = sink
        self._schedule = schedule
        self._gate = gate
        self._on_bytes = on_bytes
        self._queue = _ByteBoundedQueue(max_in_flight_bytes)

    async def run(self) -> PipeEnd:
        """Forward until the source's EOF has been delivered, or either side fails."""
        reader = asyncio.create_task(self._read())
        writer = asyncio.create_task(self._write())
        try:
            await asyncio.wait((reader, writer), return_when=asyncio.FIRST_COMPLETED)
            if reader.done() and reader.result() is PipeEnd.RESET:
                # The source reset. In-flight bytes are dropped: a reset discards them on a
                # real link too.
                return PipeEnd.RESET
            return await writer
        finally:
            for task in (reader, writer):
                task.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)

    async def _read(self) -> PipeEnd | None:
        """Queue chunks until EOF (queued as ``b""``); ``RESET`` if the source failed."""
        while True:
            try:
                data = await self._source.read(READ_CHUNK_BYTES)
            except OSError:
                return PipeEnd.RESET
            release = self._schedule.release_at(self._clock.monotonic())
            await self._queue.put(_Item(release=release, data=data))
            if not data:
                return None

    async def _write(self) -> PipeEnd:
        clock = self._clock
        while True:
            head = await self._queue.peek()
            # Waiting on time, not on a condition an Event could signal: re-check after waking,
            # because a loop's timers may fire up to a millisecond early (uvloop keeps time in
            # whole milliseconds) and the delay is a floor. The 1 ms minimum avoids spinning.
            while (wait := head.release - clock.monotonic()) > 0:  # noqa: ASYNC110
                await asyncio.sleep(max(wait, 0.001))
            if not self._gate.is_set():
                await self._gate.wait()
            if self._sink.transport.is_closing():
                return PipeEnd.RESET  # the destination went away (uvloop refuses the write)
            sent = 0
            item: _Item | None = head
            while item is not None and item.data:
                self._sink.write(item.data)
                sent += len(item.data)
                await self._queue.pop()
                item = self._queue.head_due(clock.monotonic())
            try:
                if sent:
                    await self._sink.drain()
                    self._on_bytes(sent)
                if item is not None and not item.data:  # EOF is due
                    await self._queue.pop()
                    if self._sink.can_write_eof():
                        self._sink.write_eof()
                    return PipeEnd.EOF
            except OSError:
                return PipeEnd.RESET
