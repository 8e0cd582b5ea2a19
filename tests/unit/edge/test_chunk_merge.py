"""The edge merges what waits for a client that is behind, and nothing for one that is not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from meridian.v1 import worker_pb2
from services.common.errors import UpstreamFailed
from services.edge.chunk_merge import merge_while_behind


def content(i: int, *, logprob: bool = False) -> worker_pb2.GenerateChunk:
    chunk = worker_pb2.GenerateChunk(text=f"t{i} ", token_ids=[i])
    chunk.usage.prompt_tokens = 5
    chunk.usage.completion_tokens = i + 1
    if logprob:
        chunk.logprobs.add(token=f"t{i} ", logprob=-0.1 * i)
    return chunk


def finish(i: int) -> worker_pb2.GenerateChunk:
    chunk = worker_pb2.GenerateChunk(finish_reason=worker_pb2.FINISH_REASON_LENGTH)
    chunk.usage.prompt_tokens = 5
    chunk.usage.completion_tokens = i
    return chunk


class Source:
    """Chunks the test releases one by one (``put``), as a worker's stream would deliver them."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[worker_pb2.GenerateChunk | BaseException | None] = asyncio.Queue()
        self.closed = False

    async def chunks(self) -> AsyncGenerator[worker_pb2.GenerateChunk, None]:
        try:
            while True:
                item = await self.queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.closed = True


class Client:
    """Whether the client is behind, and the event its catching up sets."""

    def __init__(self) -> None:
        self.is_behind = False
        self.caught_up = asyncio.Event()

    def behind(self) -> bool:
        return self.is_behind

    async def drained(self) -> None:
        await self.caught_up.wait()

    def catch_up(self) -> None:
        self.is_behind = False
        self.caught_up.set()
        self.caught_up = asyncio.Event()


def received() -> list[worker_pb2.GenerateChunk]:
    return []


async def collect(
    gen: AsyncGenerator[worker_pb2.GenerateChunk, None], out: list[worker_pb2.GenerateChunk]
) -> None:
    async for chunk in gen:
        out.append(chunk)


async def settle() -> None:
    """Until the merger has taken everything put so far and is waiting again."""
    for _ in range(50):
        await asyncio.sleep(0)


async def test_a_client_that_keeps_up_gets_every_chunk_as_it_arrives() -> None:
    source, client, out = Source(), Client(), received()
    merged: list[int] = []
    task = asyncio.create_task(
        collect(
            merge_while_behind(
                source.chunks(),
                behind=client.behind,
                drained=client.drained,
                on_merged=merged.append,
            ),
            out,
        )
    )
    for i in range(3):
        source.queue.put_nowait(content(i))
        await settle()
        assert [c.text for c in out] == [f"t{k} " for k in range(i + 1)]  # no waiting
    source.queue.put_nowait(finish(3))
    source.queue.put_nowait(None)
    await task
    assert len(out) == 4
    assert out[-1].finish_reason == worker_pb2.FINISH_REASON_LENGTH
    assert merged == []
    assert source.closed


async def test_chunks_held_while_behind_go_out_as_one_when_the_client_catches_up() -> None:
    source, client, out = Source(), Client(), received()
    merged: list[int] = []
    task = asyncio.create_task(
        collect(
            merge_while_behind(
                source.chunks(),
                behind=client.behind,
                drained=client.drained,
                on_merged=merged.append,
            ),
            out,
        )
    )
    source.queue.put_nowait(content(0, logprob=True))
    await settle()
    client.is_behind = True
    for i in range(1, 5):
        source.queue.put_nowait(content(i, logprob=True))
    await settle()
    assert len(out) == 1  # held, not sent
    client.catch_up()  # no further chunk needed: catching up releases what is held
    await settle()
    assert len(out) == 2
    joined = out[1]
    assert joined.text == "t1 t2 t3 t4 "
    assert list(joined.token_ids) == [1, 2, 3, 4]
    assert [lp.token for lp in joined.logprobs] == ["t1 ", "t2 ", "t3 ", "t4 "]  # one per token
    assert joined.usage.completion_tokens == 5  # the latest cumulative usage
    assert merged == [4]
    source.queue.put_nowait(content(5))
    await settle()
    assert out[-1].text == "t5 "  # caught up: one at a time again
    source.queue.put_nowait(None)
    await task


async def test_a_finish_chunk_is_sent_after_what_was_held_never_folded_into_it() -> None:
    source, client, out = Source(), Client(), received()
    gen = merge_while_behind(source.chunks(), behind=client.behind, drained=client.drained)
    task = asyncio.create_task(collect(gen, out))
    client.is_behind = True
    for i in range(3):
        source.queue.put_nowait(content(i))
    source.queue.put_nowait(finish(3))
    source.queue.put_nowait(None)
    await task
    assert [c.text for c in out] == ["t0 t1 t2 ", ""]
    assert out[1].finish_reason == worker_pb2.FINISH_REASON_LENGTH


async def test_tool_call_pieces_and_other_choices_pass_through_in_order() -> None:
    source, client, out = Source(), Client(), received()
    gen = merge_while_behind(source.chunks(), behind=client.behind, drained=client.drained)
    task = asyncio.create_task(collect(gen, out))
    client.is_behind = True
    tool = worker_pb2.GenerateChunk()
    tool.tool_calls.add(index=0, id="call_1", name="f", arguments="{")
    other = worker_pb2.GenerateChunk(text="second choice", index=1)
    for chunk in (content(0), content(1), tool, content(2), other, content(3)):
        source.queue.put_nowait(chunk)
    source.queue.put_nowait(None)
    await task
    assert [(c.text, len(c.tool_calls), c.index) for c in out] == [
        ("t0 t1 ", 0, 0),
        ("", 1, 0),
        ("t2 ", 0, 0),
        ("second choice", 0, 1),
        ("t3 ", 0, 0),
    ]


async def test_an_upstream_error_comes_after_every_held_token() -> None:
    source, client, out = Source(), Client(), received()
    gen = merge_while_behind(source.chunks(), behind=client.behind, drained=client.drained)
    task = asyncio.create_task(collect(gen, out))
    client.is_behind = True
    source.queue.put_nowait(content(0))
    source.queue.put_nowait(content(1))
    source.queue.put_nowait(UpstreamFailed("the worker went away"))
    with pytest.raises(UpstreamFailed):
        await task
    assert [c.text for c in out] == ["t0 t1 "]


async def test_cancelling_the_consumer_while_chunks_are_held_closes_the_source() -> None:
    source, client, out = Source(), Client(), received()
    gen = merge_while_behind(source.chunks(), behind=client.behind, drained=client.drained)
    task = asyncio.create_task(collect(gen, out))
    client.is_behind = True
    source.queue.put_nowait(content(0))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await gen.aclose()
    await settle()
    assert source.closed
    assert out == []  # a cancelled stream sends nothing more
