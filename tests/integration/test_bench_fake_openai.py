"""The benchmark's fake OpenAI backend (bench/fake_openai.py) speaks what the openai engine and
bench.peers' client read: chunked SSE with usage, keep-alive, models, a cut short max_tokens."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest_asyncio

from bench.fake_openai import FakeBackend, Server
from bench.peers import Target, one_request
from services.worker.engine import ChatTurn, EngineRequest, FinishReason, SamplingOptions
from services.worker.upstream.config import UpstreamConfig
from services.worker.upstream.engine import UpstreamEngine


@pytest_asyncio.fixture
async def backend() -> AsyncIterator[str]:
    server = Server(model="fake-model", tokens=16, ttft_ms=2, itl_ms=1)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: FakeBackend(server), "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        srv.close()
        await srv.wait_closed()


async def test_the_benchmark_client_reads_every_token_over_one_connection(backend: str) -> None:
    target = Target(backend, "none", {})
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        samples = [await one_request(session, target, 64) for _ in range(3)]
    assert [s.tokens for s in samples] == [16, 16, 16]
    assert all(len(s.gaps_s) == 15 for s in samples)


async def test_the_openai_engine_relays_the_fake_backend(backend: str) -> None:
    engine = UpstreamEngine(UpstreamConfig(base_url=backend, scrape_metrics=False))
    await engine.start()
    try:
        request = EngineRequest(
            request_id="b1",
            model="fake-model",
            messages=(ChatTurn(role="user", content="hi"),),
            sampling=SamplingOptions(max_tokens=5),
        )
        async with contextlib.aclosing(engine.generate(request)) as stream:
            outs = [o async for o in stream]
    finally:
        await engine.shutdown()
    assert "".join(o.text for o in outs) == " tok" * 5
    assert outs[-1].finish_reason is FinishReason.LENGTH
    assert (outs[-1].prompt_tokens, outs[-1].completion_tokens) == (16, 5)
