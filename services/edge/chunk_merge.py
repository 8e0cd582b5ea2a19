"""Fewer, fuller SSE events for a client that is behind; every token at once for one that is not.

A client that reads slower than the model writes (a phone on a weak link, a script that
processes each delta) fills its socket's buffer; from then on every token the edge renders
waits in user space behind the ones before it. Rendering each as its own SSE event then buys
the client nothing and costs the edge a JSON encoding and a buffer append per token, and the
client a parse per token when it catches up. So while the connection is backed up, the stream
stage holds the chunks that arrive and merges them into one (text joined, token ids and
logprobs concatenated, the latest cumulative usage) — the shape OpenAI-compatible servers send
when several tokens come out of one step — and sends it the moment the client catches up
(``drained``), or with the next chunk that finds the connection free. No timer: a client that
keeps up sees each chunk as it arrives, unmerged, with no added delay.

Only plain content merges: a chunk that carries tool-call pieces, a finish reason, a
hand-off, echo fields or another choice's index is passed through in order (after whatever
was held), so those keep their exact wire shape.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from meridian.v1 import worker_pb2

#: Chunks joined into one event at most: bounds what the edge holds per stream (and the size
#: of one event), and keeps a client that stopped reading meeting the write timeout.
MAX_HELD_CHUNKS = 64


def mergeable(chunk: worker_pb2.GenerateChunk) -> bool:
    """Plain content of choice 0: what can be joined with its neighbours without changing
    what a client assembles from the deltas."""
    return (
        chunk.index == 0
        and chunk.finish_reason == worker_pb2.FINISH_REASON_UNSPECIFIED
        and not chunk.tool_calls
        and not chunk.handoff
        and not chunk.prompt_text
        and not chunk.prompt_logprobs
    )


class _Held:
    """The chunks held back while the client is behind, joined into one."""

    __slots__ = ("_chunk", "_parts", "count")

    def __init__(self) -> None:
        self._chunk: worker_pb2.GenerateChunk | None = None
        self._parts: list[str] = []
        self.count = 0

    def add(self, chunk: worker_pb2.GenerateChunk) -> None:
        self.count += 1
        if self._chunk is None:
            self._chunk = chunk
            self._parts = [chunk.text]
            return
        held = self._chunk
        self._parts.append(chunk.text)
        held.token_ids.extend(chunk.token_ids)
        held.logprobs.extend(chunk.logprobs)
        held.usage.CopyFrom(chunk.usage)  # cumulative: the latest is the total so far
        if chunk.HasField("timings"):
            held.timings.CopyFrom(chunk.timings)

    def take(self) -> worker_pb2.GenerateChunk | None:
        held, self._chunk = self._chunk, None
        if held is not None and len(self._parts) > 1:
            held.text = "".join(self._parts)
        self._parts = []
        self.count = 0
        return held


async def merge_while_behind(
    chunks: AsyncGenerator[worker_pb2.GenerateChunk, None],
    *,
    behind: Callable[[], bool],
    drained: Callable[[], Awaitable[None]],
    on_merged: Callable[[int], None] | None = None,
    max_held: int = MAX_HELD_CHUNKS,
) -> AsyncGenerator[worker_pb2.GenerateChunk, None]:
    """``chunks`` as they come while ``behind()`` is false; while it is true, the mergeable
    ones joined and yielded once ``drained()`` returns or a chunk arrives to find the client
    caught up (closing it closes ``chunks``). ``on_merged(n)``: called with the number of
    chunks each merged one replaced. At most ``max_held`` chunks go into one.

    An error from ``chunks`` is raised after what was held has been yielded, so the client
    gets every token that was generated before the error event.
    """
    held = _Held()
    upcoming: asyncio.Future[worker_pb2.GenerateChunk] | None = None

    def release() -> worker_pb2.GenerateChunk | None:
        n = held.count
        out = held.take()
        if on_merged is not None and n > 1:
            on_merged(n)
        return out

    try:
        while True:
            try:
                if not held.count:
                    # The hot path: nothing held, read straight through.
                    if upcoming is not None:
                        chunk = await upcoming
                        upcoming = None
                    else:
                        chunk = await anext(chunks)
                else:
                    # Something is held: wake on whichever comes first, the next chunk or
                    # the client catching up (then send what is held and keep waiting).
                    if upcoming is None:
                        upcoming = asyncio.ensure_future(anext(chunks))
                    caught_up = asyncio.ensure_future(drained())
                    try:
                        waiting: set[asyncio.Future[Any]] = {upcoming, caught_up}
                        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        # Its wait ends (transport marks restored) before the next one starts.
                        caught_up.cancel()
                        await asyncio.wait({caught_up})
                    if not upcoming.done():
                        out = release()
                        if out is not None:
                            yield out
                        continue
                    chunk = upcoming.result()
                    upcoming = None
            except StopAsyncIteration:
                out = release()
                if out is not None:
                    yield out
                return
            except Exception:
                # Not a cancellation: a cancelled stream sends nothing more.
                out = release()
                if out is not None:
                    yield out
                raise
            if behind() and mergeable(chunk):  # the cheap test first: this runs per token
                held.add(chunk)
                if held.count >= max_held:
                    # Bounded: the merged event is written (into the transport's buffer), so
                    # a client that stopped reading meets the write timeout, as unmerged.
                    out = release()
                    assert out is not None
                    yield out
                continue
            if held.count and mergeable(chunk):
                held.add(chunk)  # caught up: this one goes out with what was held
                out = release()
                assert out is not None
                yield out
                continue
            out = release()
            if out is not None:
                yield out
            yield chunk
    finally:
        if upcoming is not None and not upcoming.done():
            upcoming.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await upcoming
        await chunks.aclose()
