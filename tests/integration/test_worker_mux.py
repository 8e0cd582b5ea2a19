"""GenerateMux: every stream to a worker over one gRPC call, over real sockets.

It is the edge's default, so the whole suite runs over it
(``MERIDIAN_TEST_WORKER_TRANSPORT=call`` runs it over one Generate call per stream instead).
These tests pin what only this transport has: many streams per message, per-stream flow
control (a stream nobody reads does not hold up the others), the same errors as Generate,
cancellation as a message, every stream failing over when the call breaks, and older workers
used over Generate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from meridian.v1 import worker_pb2
from services.common.errors import Unavailable
from services.edge.counters import EdgeCounters
from services.edge.upstream.mux import WINDOW
from services.edge.upstream.worker_pool import TokenCall, WorkerPool
from services.worker import mux as worker_mux
from services.worker.mux import MAX_WINDOW, MuxSession
from services.worker.service import WorkerService
from services.worker.sim import SimConfig, SimEngine
from tests.support.inproc import RunningWorker, start_worker
from tests.support.wait import eventually

MODEL = "meridian-sim"


def request(i: int, *, tokens: int = 40, model: str = MODEL) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        request_id=f"mux-{i}",
        model=model,
        messages=[worker_pb2.ChatMessage(role="user", content=f"stream {i}")],
        sampling=worker_pb2.SamplingParams(max_tokens=tokens, ignore_eos=True, seed=i),
    )


async def drain(call: TokenCall) -> tuple[str, list[int], worker_pb2.GenerateChunk]:
    """Every chunk of a stream: its text, token ids and last chunk."""
    text: list[str] = []
    ids: list[int] = []
    last = worker_pb2.GenerateChunk()
    while True:
        chunk = await call.read()
        if chunk is grpc.aio.EOF:
            return "".join(text), ids, last
        text.append(chunk.text)
        ids.extend(chunk.token_ids)
        last = chunk


@pytest.fixture
async def worker() -> AsyncIterator[RunningWorker]:
    engine = SimEngine(SimConfig(models=(MODEL,), time_scale=0.05, max_num_seqs=64))
    running = await start_worker(engine, worker_id="kr-1", region="kr")
    yield running
    await running.stop()


@pytest.fixture
async def pools() -> AsyncIterator[tuple[WorkerPool, WorkerPool, EdgeCounters]]:
    counters = EdgeCounters()
    mux, call = WorkerPool("mux", counters), WorkerPool("call")
    yield mux, call, counters
    await mux.close()
    await call.close()


async def test_streams_over_one_call_are_what_generate_calls_give(
    worker: RunningWorker, pools: tuple[WorkerPool, WorkerPool, EdgeCounters]
) -> None:
    mux, direct, counters = pools
    n = 16
    expected = await asyncio.gather(
        *(drain(direct.generate(worker.address, request(i), timeout_s=None)) for i in range(n))
    )
    got = await asyncio.gather(
        *(drain(mux.generate(worker.address, request(i), timeout_s=None)) for i in range(n))
    )
    for (text, ids, last), (want_text, want_ids, want_last) in zip(got, expected, strict=True):
        assert text == want_text
        assert ids == want_ids
        assert last.finish_reason == want_last.finish_reason == worker_pb2.FINISH_REASON_LENGTH
        assert last.usage == want_last.usage
    assert counters.mux_calls_opened == 1  # one call carried all sixteen
    tokens = sum(len(ids) for _, ids, _ in got)
    assert counters.mux_events >= tokens // 2  # merged chunks aside, an event per output
    assert counters.mux_frames < counters.mux_events  # streams shared frames
    assert worker.engine.load().running == 0


async def test_a_stream_nobody_reads_waits_at_the_worker_and_holds_up_no_other(
    worker: RunningWorker, pools: tuple[WorkerPool, WorkerPool, EdgeCounters]
) -> None:
    mux, _, _ = pools
    stalled = mux.generate(worker.address, request(1, tokens=4 * WINDOW), timeout_s=None)
    first = await stalled.read()  # then never read again: its credit runs out
    assert first is not grpc.aio.EOF
    _, ids, last = await asyncio.wait_for(
        drain(mux.generate(worker.address, request(2, tokens=3 * WINDOW), timeout_s=None)),
        timeout=30.0,
    )
    assert len(ids) == 3 * WINDOW
    assert last.finish_reason == worker_pb2.FINISH_REASON_LENGTH
    # The stalled one still has everything, in order, when its reader comes back.
    _, rest_ids, rest_last = await asyncio.wait_for(drain(stalled), timeout=30.0)
    assert len(first.token_ids) + len(rest_ids) == 4 * WINDOW
    assert rest_last.usage.completion_tokens == 4 * WINDOW


async def test_a_worker_error_ends_the_stream_with_the_status_generate_would_give(
    worker: RunningWorker, pools: tuple[WorkerPool, WorkerPool, EdgeCounters]
) -> None:
    mux, direct, _ = pools
    errors = []
    for pool in (direct, mux):
        call = pool.generate(worker.address, request(3, model="no-such-model"), timeout_s=None)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        errors.append(info.value)
    want, got = errors
    assert got.code() == want.code() == grpc.StatusCode.NOT_FOUND
    assert got.details() == want.details()
    assert dict(got.trailing_metadata()) == dict(want.trailing_metadata())
    # The call itself lives on: the next stream on it is served.
    _, ids, _ = await drain(mux.generate(worker.address, request(4), timeout_s=None))
    assert len(ids) == 40


async def test_a_draining_worker_refuses_a_new_stream_as_it_refuses_a_generate_call(
    worker: RunningWorker, pools: tuple[WorkerPool, WorkerPool, EdgeCounters]
) -> None:
    mux, _, _ = pools
    await drain(mux.generate(worker.address, request(5), timeout_s=None))  # call is open
    draining = asyncio.create_task(worker.service.drain(0.5))
    await asyncio.sleep(0.05)
    call = mux.generate(worker.address, request(6), timeout_s=None)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.value.trailing_metadata()  # a refusal (trailers), not a lost connection
    assert "draining" in (info.value.details() or "")
    await draining
    assert isinstance(Unavailable("x"), Unavailable)


async def test_cancelling_a_stream_aborts_its_generation_and_only_it(
    worker: RunningWorker, pools: tuple[WorkerPool, WorkerPool, EdgeCounters]
) -> None:
    mux, _, _ = pools
    doomed = mux.generate(worker.address, request(7, tokens=8_000), timeout_s=None)
    await doomed.read()
    survivor = mux.generate(worker.address, request(8, tokens=200), timeout_s=None)
    await survivor.read()
    assert worker.engine.load().running == 2
    assert doomed.cancel()
    assert doomed.done()
    for _ in range(200):
        if worker.engine.load().running == 1:
            break
        await asyncio.sleep(0.01)
    assert worker.engine.load().running == 1  # the cancel message aborted it at the engine
    _, ids, last = await drain(survivor)
    assert last.usage.completion_tokens == 200
    assert len(ids) >= 1


async def test_when_the_call_breaks_every_stream_on_it_fails_like_a_broken_generate_call(
    pools: tuple[WorkerPool, WorkerPool, EdgeCounters],
) -> None:
    mux, _, counters = pools
    engine = SimEngine(SimConfig(models=(MODEL,), time_scale=0.05, max_num_seqs=64))
    doomed = await start_worker(engine, worker_id="kr-2", region="kr")
    calls = [
        mux.generate(doomed.address, request(i, tokens=8_000), timeout_s=None) for i in range(5)
    ]
    for call in calls:
        await call.read()
    await doomed.die()
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await drain(call)
        # What the edge reads as "lost the connection mid-stream": the stream migrates.
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not info.value.trailing_metadata()
    assert counters.mux_calls_broken == 1


def old_worker_handlers(service: WorkerService) -> grpc.GenericRpcHandler:
    """A worker from before GenerateMux: its Worker service has Generate and nothing else, so
    gRPC itself answers UNIMPLEMENTED for GenerateMux."""
    generate = grpc.unary_stream_rpc_method_handler(
        service.Generate,
        request_deserializer=worker_pb2.GenerateRequest.FromString,
        response_serializer=worker_pb2.GenerateChunk.SerializeToString,
    )
    return grpc.method_handlers_generic_handler("meridian.v1.Worker", {"Generate": generate})


async def test_a_worker_without_generate_mux_is_used_over_generate(
    pools: tuple[WorkerPool, WorkerPool, EdgeCounters],
) -> None:
    mux, _, counters = pools
    engine = SimEngine(SimConfig(models=(MODEL,), time_scale=0.05))
    await engine.start()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (old_worker_handlers(WorkerService(engine=engine, worker_id="old-1", region="kr")),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        address = f"127.0.0.1:{port}"
        first = await asyncio.gather(
            *(drain(mux.generate(address, request(i), timeout_s=None)) for i in range(3))
        )  # opened on GenerateMux, answered UNIMPLEMENTED, carried on as Generate calls
        assert all(len(ids) == 40 for _, ids, _ in first)
        _, ids, _ = await drain(mux.generate(address, request(9), timeout_s=None))
        assert len(ids) == 40
        assert counters.mux_calls_opened == 1  # not retried for every stream
    finally:
        await server.stop(None)
        await engine.shutdown()


async def _raw_mux(
    address: str, messages: list[worker_pb2.MuxRequest], *, idle_s: float = 2.0
) -> tuple[list[worker_pb2.MuxEvent], grpc.aio.Call]:
    """A GenerateMux call as a client other than the edge makes it: ``messages``, then read
    frames until the call ends or none comes for ``idle_s``."""
    from meridian.v1 import worker_pb2_grpc

    channel = grpc.aio.insecure_channel(address)
    queue: asyncio.Queue[worker_pb2.MuxRequest | None] = asyncio.Queue()
    for m in messages:
        queue.put_nowait(m)

    async def requests() -> AsyncIterator[worker_pb2.MuxRequest]:
        while (m := await queue.get()) is not None:
            yield m

    call = worker_pb2_grpc.WorkerStub(channel).GenerateMux(requests(), timeout=20.0)
    events: list[worker_pb2.MuxEvent] = []
    try:
        while True:
            try:
                frame = await asyncio.wait_for(call.read(), idle_s)
            except TimeoutError:
                break
            if frame is grpc.aio.EOF:
                break
            events.extend(frame.events)
    except grpc.aio.AioRpcError:
        pass
    finally:
        queue.put_nowait(None)
    await channel.close()
    return events, call


def _open(stream_id: int, i: int, *, window: int = 0) -> worker_pb2.MuxRequest:
    return worker_pb2.MuxRequest(
        stream_id=stream_id, open=worker_pb2.MuxOpen(request=request(i), window=window)
    )


async def test_a_stream_id_opened_twice_ends_the_call_as_invalid_argument(
    worker: RunningWorker,
) -> None:
    """An end under a live stream's id could not be told from that stream's own end."""
    events, call = await _raw_mux(worker.address, [_open(7, 1), _open(7, 2)])
    assert await call.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "already open" in (await call.details() or "")
    assert not any(e.HasField("end") and e.stream_id == 7 and e.end.code for e in events)


async def test_a_window_asked_beyond_the_cap_is_held_to_it(worker: RunningWorker) -> None:
    from services.worker.mux import MAX_WINDOW

    tokens = MAX_WINDOW + 200
    events, call = await _raw_mux(
        worker.address,
        [
            worker_pb2.MuxRequest(
                stream_id=1,
                open=worker_pb2.MuxOpen(request=request(1, tokens=tokens), window=2**32 - 1),
            )
        ],
    )
    chunks = [e for e in events if e.HasField("chunk")]
    # No credit is ever sent: the stream stops at the cap's chunks, unfinished.
    assert 0 < len(chunks) <= MAX_WINDOW
    assert sum(len(e.chunk.token_ids) for e in chunks) < tokens
    assert not any(e.HasField("end") for e in events)
    call.cancel()


async def test_streams_open_when_the_edge_half_closes_still_finish_with_their_end(
    worker: RunningWorker,
) -> None:
    """A client that sends its opens and then closes its side (done writing) still gets every
    token and a MuxEnd per stream, and the call ends OK: the streams were dropped, with no
    end, the moment the request side closed. Credit can no longer come, so none is needed."""
    from meridian.v1 import worker_pb2_grpc

    async def requests() -> AsyncIterator[worker_pb2.MuxRequest]:
        for i in (1, 2):
            yield _open(i, i, window=2)  # fewer chunks than the stream has

    channel = grpc.aio.insecure_channel(worker.address)
    call = worker_pb2_grpc.WorkerStub(channel).GenerateMux(requests(), timeout=20.0)
    events = [e async for frame in call for e in frame.events]
    await channel.close()
    assert await call.code() is grpc.StatusCode.OK
    for stream_id in (1, 2):
        mine = [e for e in events if e.stream_id == stream_id]
        tokens = sum(len(e.chunk.token_ids) for e in mine if e.HasField("chunk"))
        assert tokens == 40
        assert mine[-1].HasField("end")
        assert mine[-1].end.code == grpc.StatusCode.OK.value[0]


@pytest.fixture
async def roomy_worker() -> AsyncIterator[RunningWorker]:
    """A fast simulator with room for 64 long streams at once (no preemption)."""
    engine = SimEngine(
        SimConfig(models=(MODEL,), time_scale=0.1, max_num_seqs=64, kv_cache_tokens=262_144)
    )
    running = await start_worker(engine, worker_id="kr-2", region="kr")
    yield running
    await running.stop()


def _session(worker: RunningWorker) -> MuxSession:
    (session,) = worker.service._mux
    return session


async def _peak_queued(worker: RunningWorker, seconds: float) -> int:
    """The most events the worker's one GenerateMux call held unwritten over ``seconds``."""
    await eventually(lambda: bool(worker.service._mux))
    peak = 0
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while loop.time() < until:
        peak = max(peak, _session(worker).queued)
        await asyncio.sleep(0.02)
    return peak


STREAMS = 64
LONG = 600
#: The cap for these tests: lower than the default, so that few tokens fill it.
CAP = 2048


def _long_open(stream_id: int) -> worker_pb2.MuxRequest:
    return worker_pb2.MuxRequest(
        stream_id=stream_id,
        open=worker_pb2.MuxOpen(request=request(stream_id, tokens=LONG), window=MAX_WINDOW),
    )


def _small_window_channel(address: str) -> grpc.aio.Channel:
    """A caller whose transport buffers little for it (HTTP/2's 64 KiB window, never grown
    by BDP probing): what the worker writes soon fills it, and the writer waits."""
    return grpc.aio.insecure_channel(address, options=[("grpc.http2.bdp_probe", 0)])


async def _read_all(call: Any) -> dict[int, list[worker_pb2.MuxEvent]]:
    by_stream: dict[int, list[worker_pb2.MuxEvent]] = {}
    async for frame in call:
        for e in frame.events:
            by_stream.setdefault(e.stream_id, []).append(e)
    return by_stream


def _assert_every_token(by_stream: dict[int, list[worker_pb2.MuxEvent]]) -> None:
    assert sorted(by_stream) == list(range(1, STREAMS + 1))
    for mine in by_stream.values():
        assert sum(len(e.chunk.token_ids) for e in mine if e.HasField("chunk")) == LONG
        assert mine[-1].HasField("end")
        assert mine[-1].end.code == grpc.StatusCode.OK.value[0]


@pytest.mark.parametrize("how", ["half_close", "credit_only"])
async def test_a_caller_that_never_reads_holds_a_bounded_queue_and_a_reader_still_gets_all(
    roomy_worker: RunningWorker, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half-closed (credit no longer bounds a stream) or sending credit it never reads: the
    streams stop pulling once ``MAX_QUEUED_EVENTS`` wait for the writer — the call held
    every event its streams made (hundreds of thousands, +100 MB from one call) — and the
    caller that then reads still gets every token and every end."""
    from meridian.v1 import worker_pb2_grpc

    monkeypatch.setattr(worker_mux, "MAX_QUEUED_EVENTS", CAP)
    done_sending = asyncio.Event()

    async def requests() -> AsyncIterator[worker_pb2.MuxRequest]:
        for i in range(1, STREAMS + 1):
            yield _long_open(i)
        if how == "credit_only":
            while not done_sending.is_set():
                for i in range(1, STREAMS + 1):
                    yield worker_pb2.MuxRequest(stream_id=i, credit=MAX_WINDOW)
                await asyncio.sleep(0.01)

    channel = _small_window_channel(roomy_worker.address)
    try:
        call = worker_pb2_grpc.WorkerStub(channel).GenerateMux(requests(), timeout=60.0)
        peak = await _peak_queued(roomy_worker, 2.0)
        assert peak <= CAP + STREAMS  # each stream's end is queued unchecked
        assert peak > CAP // 2  # the writer was behind: the cap did the work
        done_sending.set()
        _assert_every_token(await _read_all(call))
        assert await call.code() is grpc.StatusCode.OK
    finally:
        await channel.close()


async def test_a_cancel_set_to_false_cancels_nothing(worker: RunningWorker) -> None:
    """``cancel`` is a bool in the oneof: false asks for nothing, and the stream runs on."""
    events, call = await _raw_mux(
        worker.address,
        [_open(1, 1), worker_pb2.MuxRequest(stream_id=1, cancel=False)],
        idle_s=1.0,
    )
    call.cancel()
    mine = [e for e in events if e.stream_id == 1]
    assert sum(len(e.chunk.token_ids) for e in mine if e.HasField("chunk")) == 40
    assert mine[-1].HasField("end")
    assert mine[-1].end.code == grpc.StatusCode.OK.value[0]


async def test_a_call_cancelled_while_its_writer_waits_is_still_logged_closed(
    roomy_worker: RunningWorker, caplog: pytest.LogCaptureFixture
) -> None:
    """The client cancels while the worker is blocked writing to it: ``mux.closed`` is
    logged all the same (the close's waits were cut short before the log line)."""
    from meridian.v1 import worker_pb2_grpc

    caplog.set_level(logging.INFO, logger="meridian.worker.mux")

    async def requests() -> AsyncIterator[worker_pb2.MuxRequest]:
        for i in range(1, STREAMS + 1):
            yield _long_open(i)
        await asyncio.Event().wait()  # never half-closes, never reads

    channel = _small_window_channel(roomy_worker.address)
    try:
        call = worker_pb2_grpc.WorkerStub(channel).GenerateMux(requests(), timeout=60.0)
        assert await _peak_queued(roomy_worker, 1.5) > 0  # the writer is behind
        call.cancel()
        await eventually(lambda: not roomy_worker.service._mux, timeout_s=2.0)
        await asyncio.sleep(0.05)
    finally:
        await channel.close()
    assert [r for r in caplog.records if r.getMessage() == "mux.closed"]


def echo_request(i: int, prompt_tokens: int) -> worker_pb2.GenerateRequest:
    """A completion that echoes a long prompt with 20 logprobs per token: ~5 MB of logprobs
    for 7,000 tokens, in the first output."""
    return worker_pb2.GenerateRequest(
        request_id=f"echo-{i}",
        model=MODEL,
        raw_prompt=worker_pb2.RawPrompt(
            token_ids=[1000 + (i * 7 + k) % 5000 for k in range(prompt_tokens)]
        ),
        echo=True,
        sampling=worker_pb2.SamplingParams(
            max_tokens=4, ignore_eos=True, seed=i, logprobs=True, top_logprobs=20
        ),
    )


async def read_echo(call: TokenCall) -> tuple[int, int, worker_pb2.GenerateChunk, int]:
    """Prompt logprob entries, output tokens, the last chunk and the largest chunk's size."""
    prompt_entries = tokens = largest = 0
    last = worker_pb2.GenerateChunk()
    while True:
        chunk = await call.read()
        if chunk is grpc.aio.EOF:
            return prompt_entries, tokens, last, largest
        prompt_entries += len(chunk.prompt_logprobs)
        tokens += len(chunk.token_ids)
        largest = max(largest, chunk.ByteSize())
        last = chunk


@pytest.mark.parametrize("transport", ["mux", "call"])
async def test_outputs_past_the_message_limit_arrive_in_pieces_and_break_no_other_stream(
    worker: RunningWorker, pools: tuple[WorkerPool, WorkerPool, EdgeCounters], transport: str
) -> None:
    """Four echoed 7,000-token prompts with 20 logprobs each (~20 MB at once) beside a chat
    stream, on one worker: over one GenerateMux call (its frames used to pass the 4 MiB
    message limit, which broke the call and every stream on it) or a Generate call each (one
    chunk used to pass it)."""
    mux, direct, counters = pools
    pool = mux if transport == "mux" else direct
    bystander = asyncio.ensure_future(
        drain(pool.generate(worker.address, request(1, tokens=200), timeout_s=None))
    )
    echoes = await asyncio.gather(
        *(
            read_echo(pool.generate(worker.address, echo_request(i, 7000), timeout_s=None))
            for i in range(4)
        )
    )
    for prompt_entries, tokens, last, largest in echoes:
        assert prompt_entries == last.usage.prompt_tokens == 7000
        assert tokens == last.usage.completion_tokens == 4
        assert last.finish_reason == worker_pb2.FINISH_REASON_LENGTH
        assert largest < 1024 * 1024
    _, ids, last = await bystander
    assert len(ids) == 200
    assert last.finish_reason == worker_pb2.FINISH_REASON_LENGTH
    if transport == "mux":
        assert counters.mux_calls_opened == 1


async def test_a_frame_holds_chunks_up_to_its_byte_bound_and_no_more(
    worker: RunningWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streams' chunks share frames until the next would pass ``MAX_FRAME_BYTES`` (lowered
    here, so that four echoed prompts' pieces cross it many times)."""
    from meridian.v1 import worker_pb2_grpc

    bound = 256 * 1024
    monkeypatch.setattr(worker_mux, "MAX_FRAME_BYTES", bound)

    async def requests() -> AsyncIterator[worker_pb2.MuxRequest]:
        for i in range(1, 5):
            yield worker_pb2.MuxRequest(
                stream_id=i, open=worker_pb2.MuxOpen(request=echo_request(i, 3000))
            )

    async with grpc.aio.insecure_channel(worker.address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).GenerateMux(requests(), timeout=60.0)
        sizes: list[int] = []
        shared = 0
        entries: dict[int, int] = {}
        async for frame in call:
            chunks = [e.chunk for e in frame.events if e.HasField("chunk")]
            sizes.append(sum(c.ByteSize() for c in chunks))
            shared += len(chunks) > 1
            for e in frame.events:
                entries[e.stream_id] = entries.get(e.stream_id, 0) + len(e.chunk.prompt_logprobs)
        assert await call.code() is grpc.StatusCode.OK
    assert entries == {1: 3000, 2: 3000, 3: 3000, 4: 3000}
    assert max(sizes) <= bound
    assert sum(sizes) > 8 * bound  # it was crossed
    assert shared  # and chunks still shared frames
