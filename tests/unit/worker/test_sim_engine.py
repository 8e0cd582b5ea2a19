"""SimEngine in real time (100x faster than modelled): streaming, cancellation, batching,
abort, lifecycle. Assertions are about behaviour, never about how long something took."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.common.clock import ManualClock
from services.common.errors import ContextLengthExceeded, ModelNotFound, Unavailable
from services.worker.engine import (
    ChatTurn,
    EngineOutput,
    EngineRequest,
    FinishReason,
    ModelState,
    SamplingOptions,
)
from services.worker.sim.config import SimConfig
from services.worker.sim.engine import SimEngine, merge_outputs
from services.worker.sim.scheduler import SimScheduler

FAST = SimConfig(time_scale=0.01)


def req(request_id: str, **sampling: Any) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        model="meridian-sim",
        messages=(ChatTurn(role="user", content=f"Tell me about {request_id}."),),
        sampling=SamplingOptions(**sampling),
    )


@pytest.fixture
async def engine() -> AsyncIterator[SimEngine]:
    e = SimEngine(FAST)
    await e.start()
    yield e
    await e.shutdown()


async def collect(e: SimEngine, request: EngineRequest) -> list[EngineOutput]:
    return [out async for out in e.generate(request)]


class Consumer:
    """Reads one stream in a task; ``started`` is set after the first output."""

    def __init__(self, e: SimEngine, request: EngineRequest) -> None:
        self.outputs: list[EngineOutput] = []
        self.started = asyncio.Event()
        self.task = asyncio.create_task(self._read(e, request))

    async def _read(self, e: SimEngine, request: EngineRequest) -> None:
        async for out in e.generate(request):
            self.outputs.append(out)
            self.started.set()


async def test_streams_the_same_text_as_the_pure_scheduler(engine: SimEngine) -> None:
    request = req("a", seed=9, max_tokens=40, ignore_eos=True)
    outs = await collect(engine, request)
    assert [o.finish_reason for o in outs] == [None] * (len(outs) - 1) + [FinishReason.LENGTH]
    assert sum(len(o.token_ids) for o in outs) == outs[-1].completion_tokens == 40
    assert outs[0].queue_ms is not None
    assert outs[0].prefill_ms is not None
    assert outs[-1].decode_ms is not None

    pure = SimScheduler(FAST)
    pure.add(dataclasses.replace(request, request_id="other-id"), 0.0)
    clock, text = ManualClock(), ""
    while (result := pure.step(clock.monotonic())) is not None:
        clock.advance(result.plan.duration_s)
        text += "".join(o.text for o in result.outputs.values())
    assert "".join(o.text for o in outs) == text
    assert engine.load().running == 0


async def test_bad_requests_fail_before_any_output(engine: SimEngine) -> None:
    with pytest.raises(ModelNotFound) as info:
        await collect(engine, EngineRequest("x", "nope", (ChatTurn("user", "hi"),)))
    assert info.value.param == "model"
    with pytest.raises(ContextLengthExceeded) as ctx:
        await collect(engine, req("y", max_tokens=10_000))
    assert ctx.value.param == "max_tokens"
    assert engine.load().waiting == 0


async def test_cancelling_the_consumer_frees_its_slot_and_kv(engine: SimEngine) -> None:
    c = Consumer(engine, req("a", ignore_eos=True, max_tokens=5000))
    await c.started.wait()
    assert engine.load().running == 1
    assert engine.load().kv_cache_usage > 0
    c.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await c.task
    load = engine.load()
    assert (load.running, load.waiting, load.kv_cache_usage) == (0, 0, 0.0)


async def test_leaving_the_stream_early_aborts_the_request(engine: SimEngine) -> None:
    stream = engine.generate(req("a", ignore_eos=True, max_tokens=5000))
    async for _ in stream:
        break
    await stream.aclose()
    assert engine.load().running == 0
    assert engine.load().kv_cache_usage == 0.0


async def test_concurrent_requests_batch_together(engine: SimEngine) -> None:
    consumers = [Consumer(engine, req(f"r{i}", ignore_eos=True, max_tokens=5000)) for i in range(8)]
    await asyncio.gather(*(c.started.wait() for c in consumers))
    load = engine.load()
    assert (load.running, load.waiting) == (8, 0)
    await asyncio.sleep(0.05)
    assert engine.load().tokens_per_second > 0
    # Every sequence advances in every step: their token counts stay within one step's lag.
    counts = [c.outputs[-1].completion_tokens for c in consumers]
    assert max(counts) - min(counts) <= 1
    await engine.shutdown()
    await asyncio.gather(*(c.task for c in consumers))
    assert all(c.outputs[-1].finish_reason is FinishReason.ABORT for c in consumers)


async def test_abort_ends_a_live_stream_with_abort(engine: SimEngine) -> None:
    c = Consumer(engine, req("a", ignore_eos=True, max_tokens=5000))
    await c.started.wait()
    await engine.abort("a")
    await c.task
    final = c.outputs[-1]
    assert final.finish_reason is FinishReason.ABORT
    assert final.completion_tokens == sum(len(o.token_ids) for o in c.outputs)
    assert engine.load().running == 0
    await engine.abort("a")  # idempotent
    await engine.abort("unknown")


async def test_a_slow_reader_gets_merged_outputs_and_loses_nothing(engine: SimEngine) -> None:
    outs: list[EngineOutput] = []
    async for out in engine.generate(req("a", seed=4, ignore_eos=True, max_tokens=60)):
        outs.append(out)
        await asyncio.sleep(0.01)  # several engine steps per read
    assert len(outs) < 60
    assert sum(len(o.token_ids) for o in outs) == outs[-1].completion_tokens == 60
    assert outs[-1].finish_reason is FinishReason.LENGTH


async def test_models_are_loading_until_start_returns() -> None:
    e = SimEngine(SimConfig(models=("a", "b"), load_delay_s=5.0, time_scale=0.01))
    starting = asyncio.create_task(e.start())
    await asyncio.sleep(0)
    assert [(m.name, m.state) for m in e.models()] == [
        ("a", ModelState.LOADING),
        ("b", ModelState.LOADING),
    ]
    with pytest.raises(Unavailable):
        await collect(e, EngineRequest("x", "a", (ChatTurn("user", "hi"),)))
    with pytest.raises(ModelNotFound):  # a request that can never succeed says so first
        await collect(e, EngineRequest("x", "c", (ChatTurn("user", "hi"),)))
    await starting
    models = e.models()
    assert {m.state for m in models} == {ModelState.READY}
    assert {(m.max_model_len, m.engine) for m in models} == {(8192, "sim")}
    outs = await collect(e, EngineRequest("x", "b", (ChatTurn("user", "hi"),)))
    assert outs[-1].finish_reason is FinishReason.STOP
    await e.shutdown()
    with pytest.raises(Unavailable):
        await collect(e, EngineRequest("y", "a", (ChatTurn("user", "hi"),)))


def test_merge_outputs_concatenates_deltas_and_keeps_every_timing() -> None:
    a = EngineOutput(text="Hel", token_ids=(1,), completion_tokens=1, queue_ms=2.0, prefill_ms=3.0)
    b = EngineOutput(
        text="lo",
        token_ids=(2,),
        completion_tokens=2,
        finish_reason=FinishReason.STOP,
        decode_ms=4.0,
    )
    m = merge_outputs(a, b)
    assert (m.text, m.token_ids, m.completion_tokens, m.finish_reason) == (
        "Hello",
        (1, 2),
        2,
        FinishReason.STOP,
    )
    assert (m.queue_ms, m.prefill_ms, m.decode_ms) == (2.0, 3.0, 4.0)


async def test_a_consumer_cancelled_between_reads_aborts_via_aclosing(engine: SimEngine) -> None:
    """The way a server should consume: ``aclosing`` closes the stream even when the task is
    cancelled while awaiting something else (a slow client write), not when the GC gets to it."""
    reading = asyncio.Event()

    async def serve() -> None:
        stream = engine.generate(req("a", ignore_eos=True, max_tokens=5000))
        async with contextlib.aclosing(stream):
            async for _ in stream:
                reading.set()
                await asyncio.Event().wait()  # a write that never completes

    task = asyncio.create_task(serve())
    await reading.wait()
    assert engine.load().running == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (engine.load().running, engine.load().kv_cache_usage) == (0, 0.0)


async def test_shutdown_while_loading_never_goes_ready() -> None:
    e = SimEngine(SimConfig(load_delay_s=5.0, time_scale=0.01))
    starting = asyncio.create_task(e.start())
    await asyncio.sleep(0)
    await e.shutdown()
    await starting
    assert {m.state for m in e.models()} == {ModelState.DRAINING}
    with pytest.raises(Unavailable):
        await collect(e, req("a"))
