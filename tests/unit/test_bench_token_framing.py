"""The multiplexed framing of ``bench.token_framing``: what a frame carries, how the client
splits it, and when the server's session writes one (the figures rest on these)."""

from __future__ import annotations

import asyncio
from typing import Any

from bench.token_framing import Frame, MuxSession, build_frame, demux
from meridian.v1 import worker_pb2


def test_a_frame_has_one_entry_per_stream_with_its_pending_tokens_merged_in_order() -> None:
    frame = build_frame({7: ([("a", 1), ("b", 2)], False), 9: ([("c", 3)], True)})
    wire = Frame.FromString(frame.SerializeToString())
    assert [(e.stream, e.chunk.text, list(e.chunk.token_ids)) for e in wire.entries] == [
        (7, "ab", [1, 2]),
        (9, "c", [3]),
    ]
    assert wire.entries[0].chunk.finish_reason == worker_pb2.FINISH_REASON_UNSPECIFIED
    assert wire.entries[1].chunk.finish_reason == worker_pb2.FINISH_REASON_LENGTH


async def test_demux_hands_each_entry_to_its_streams_queue_and_counts_unknown_streams() -> None:
    queues: dict[int, asyncio.Queue[worker_pb2.GenerateChunk]] = {
        7: asyncio.Queue(),
        9: asyncio.Queue(),
    }
    frame = build_frame({7: ([("a", 1)], False), 8: ([("x", 5)], False), 9: ([("c", 3)], True)})
    assert demux(frame, queues) == 1  # stream 8 is gone (cancelled): its token is dropped
    assert queues[7].get_nowait().text == "a"
    assert queues[9].get_nowait().token_ids == [3]
    assert queues[7].empty()
    assert queues[9].empty()


class SlowContext:
    """A servicer context whose writes take a moment, as a write waiting on the transport."""

    def __init__(self) -> None:
        self.frames: list[list[tuple[int, str]]] = []
        self.release = asyncio.Event()

    async def write(self, frame: Any) -> None:
        self.frames.append([(e.stream, e.chunk.text) for e in frame.entries])
        await self.release.wait()
        self.release.clear()


async def test_tokens_of_one_loop_iteration_share_a_frame_and_those_during_a_write_the_next() -> (
    None
):
    session = MuxSession(asyncio.get_running_loop())
    ctx = SlowContext()
    writer = asyncio.create_task(session.write_frames(ctx))  # type: ignore[arg-type]
    try:
        session.push(1, "a", 10, False)
        session.push(2, "b", 20, False)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert ctx.frames == [[(1, "a"), (2, "b")]]  # one iteration's tokens: one frame
        session.push(1, "c", 11, False)  # while that write is still in flight
        await asyncio.sleep(0)
        session.push(1, "d", 12, True)
        ctx.release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert ctx.frames[1] == [(1, "cd")]  # merged behind the busy write, in order
        assert len(ctx.frames) == 2
    finally:
        ctx.release.set()
        writer.cancel()
