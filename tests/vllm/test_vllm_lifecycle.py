"""Start, failure and shutdown of the vLLM engine: each test owns its engine (not the session's)."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path

import pytest

from services.common.errors import Unavailable
from services.worker.engine import (
    ChatTurn,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    ModelState,
    SamplingOptions,
)
from services.worker.vllm.config import VllmConfig
from services.worker.vllm.engine import VllmEngine

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]


def chat(request_id: str, model: str = "tiny") -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        model=model,
        messages=(ChatTurn(role="user", content="Hello"),),
        sampling=SamplingOptions(ignore_eos=True),
    )


async def test_a_failed_start_reports_failed_with_the_reason(tiny_model_dir: Path) -> None:
    # The tiny model's positions stop at 512: a longer context is refused by vLLM.
    config = VllmConfig(model=str(tiny_model_dir), served_model_name="tiny", max_model_len=4096)
    engine = VllmEngine(config)

    with pytest.raises(ValueError, match="max_model_len"):
        await engine.start()

    assert engine.models()[0].state is ModelState.FAILED
    assert engine.failure is not None
    assert "max_model_len" in engine.failure
    with pytest.raises(Unavailable, match="failed"):
        await anext(engine.generate(chat("after-failure")))


async def test_loading_then_ready_then_shutdown_aborts_what_is_in_flight(
    tiny_model_dir: Path,
) -> None:
    engine = VllmEngine(VllmConfig.cpu_test(tiny_model_dir, served_model_name="tiny"))
    assert engine.models()[0].state is ModelState.LOADING
    assert replace(engine.load(), gpus=()) == EngineLoad(
        running=0, waiting=0, max_running=16, kv_cache_usage=0.0, tokens_per_second=0.0
    )
    with pytest.raises(Unavailable, match="loading"):
        await anext(engine.generate(chat("too-early")))

    await engine.start()
    assert engine.models()[0].state is ModelState.READY
    assert engine.models()[0].max_model_len == 256

    first = asyncio.Event()

    async def consume() -> list[EngineOutput]:
        outputs = []
        async with aclosing(engine.generate(chat("in-flight"))) as stream:
            async for output in stream:
                outputs.append(output)
                first.set()
        return outputs

    task = asyncio.create_task(consume())
    await first.wait()
    await engine.shutdown()
    outputs = await task

    assert outputs[-1].finish_reason is FinishReason.ABORT
    assert engine.models()[0].state is ModelState.DRAINING
    with pytest.raises(Unavailable, match="draining"):
        await anext(engine.generate(chat("too-late")))
