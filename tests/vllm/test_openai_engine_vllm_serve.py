"""``--engine openai`` in front of a real ``vllm serve`` (vLLM's own OpenAI server, CPU build,
the tiny model): models and context length from its ``/v1/models``, greedy streaming with
vLLM's own usage, a refusal mapped, its ``/metrics`` read for load, and a closed stream that
vLLM itself sees go away (its running-requests gauge falls back to 0 while the request still
had tokens to generate), and the whole edge → router → worker path in front of it.

The server is one process for the module (start ~20-40 s on these machines).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio

from services.common.errors import InvalidRequest
from services.common.net import free_port
from services.worker.engine import ChatTurn, EngineRequest, FinishReason, SamplingOptions
from services.worker.upstream.config import UpstreamConfig
from services.worker.upstream.engine import UpstreamEngine
from tests.support.inproc import start_edge, start_router, start_worker, stop_all
from tests.support.wait import eventually

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

SERVED = "tiny-llama-serve"
CONTEXT = 256


@pytest.fixture(scope="module")
def vllm_serve(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model_dir), "--served-model-name", SERVED,
        "--host", "127.0.0.1", "--port", str(port), "--seed", "0",
        "--dtype", "float32", "--max-model-len", str(CONTEXT), "--max-num-seqs", "16",
        "--gpu-memory-utilization", "0.15", "--enforce-eager",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"vllm serve did not come up:\n{log.read_text()[-4000:]}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{base}/models", timeout=2) as resp,
            ):
                if resp.status == 200:
                    break
            time.sleep(0.5)
        yield base
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(vllm_serve: str) -> AsyncIterator[UpstreamEngine]:
    eng = UpstreamEngine(UpstreamConfig(base_url=vllm_serve, scrape_interval_s=0.1))
    await eng.start()
    yield eng
    await eng.shutdown()


def chat(rid: str, **sampling: object) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        model=SERVED,
        messages=(ChatTurn(role="user", content="Tell me about the edge of the network."),),
        sampling=SamplingOptions(**sampling),  # type: ignore[arg-type]
    )


async def test_models_and_context_length_come_from_vllm(engine: UpstreamEngine) -> None:
    (model,) = engine.models()
    assert model.name == SERVED
    assert model.max_model_len == CONTEXT


async def test_greedy_stream_ends_with_vllms_own_usage(engine: UpstreamEngine) -> None:
    async with contextlib.aclosing(
        engine.generate(chat("v1", max_tokens=8, temperature=0.0, ignore_eos=True))
    ) as stream:
        outs = [o async for o in stream]
    assert "".join(o.text for o in outs)
    assert outs[-1].finish_reason is FinishReason.LENGTH
    assert outs[-1].completion_tokens == 8
    assert outs[-1].prompt_tokens > 0


async def test_a_request_vllm_refuses_is_an_invalid_request(engine: UpstreamEngine) -> None:
    async def drain() -> None:
        async with contextlib.aclosing(engine.generate(chat("v2", max_tokens=10_000))) as s:
            async for _ in s:
                pass

    with pytest.raises(InvalidRequest):
        await drain()


async def test_truncation_asks_vllms_tokenize_which_oldest_turns_to_drop(
    engine: UpstreamEngine,
) -> None:
    """vLLM refuses a conversation past its context; with truncate_oldest the worker counts
    candidates with vLLM's own POST /tokenize and sends the one that fits."""
    talk = (
        ChatTurn(role="system", content="Be brief."),
        ChatTurn(role="user", content="Tell me everything." + " word" * 300),
        ChatTurn(role="assistant", content="Once upon a time."),
        ChatTurn(role="user", content="Tell me about the edge of the network."),
    )
    request = EngineRequest(
        request_id="v-trunc",
        model=SERVED,
        messages=talk,
        sampling=SamplingOptions(max_tokens=4, ignore_eos=True),
        truncate_oldest=True,
    )
    async with contextlib.aclosing(engine.generate(request)) as stream:
        outs = [o async for o in stream]
    assert outs[0].dropped_messages == 2
    assert outs[-1].completion_tokens == 4
    assert 0 < outs[-1].prompt_tokens <= CONTEXT - 4


async def test_closing_the_stream_makes_vllm_abort_the_request(engine: UpstreamEngine) -> None:
    await eventually(lambda: engine.upstream_load is not None, timeout_s=10)
    async with contextlib.aclosing(
        engine.generate(chat("v3", max_tokens=200, temperature=0.0, ignore_eos=True))
    ) as stream:
        seen = 0
        async for out in stream:
            seen += len(out.text) > 0
            if seen == 2:
                load = engine.upstream_load
                assert load is not None
                break
    # vLLM saw the disconnect: its own running gauge drops to 0 long before 200 tokens could
    # have been generated (the stream was closed after two).
    await eventually(
        lambda: engine.upstream_load is not None and engine.upstream_load.running == 0,
        timeout_s=20,
    )
    await asyncio.sleep(0)


async def test_the_whole_path_serves_vllm_serve_through_edge_and_router(
    vllm_serve: str, redis_url: str
) -> None:
    engine = UpstreamEngine(UpstreamConfig(base_url=vllm_serve, scrape_metrics=False))
    worker = await start_worker(engine, worker_id="kr-serve-1", region="kr")
    router = await start_router([worker.address])
    edge = await start_edge(redis_url=redis_url, router_address=router.address)
    try:
        await router.wait_healthy(1)
        key = await edge.new_key()
        async with openai.AsyncOpenAI(base_url=f"{edge.url}/v1", api_key=key, max_retries=0) as api:
            stream = await api.chat.completions.create(
                model=SERVED,
                messages=[{"role": "user", "content": "Hello"}],
                max_tokens=6,
                temperature=0.0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            chunks = [c async for c in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 6
        assert chunks[-1].usage.prompt_tokens > 0
    finally:
        await stop_all(edge, router, worker)
