"""Acceptance: limits that are exact across edge replicas.

Two edges share one Redis (and the stack's router and workers); 100 concurrent requests are
split between them. Whatever the interleaving, the tenant's requests per minute and
concurrent streams are never exceeded, and its tokens per minute by at most one request's
reservation (a request that used more than it reserved is charged in full, after the fact).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest
import redis.asyncio as aioredis

from services.edge.openai_types import parse_chat_request
from services.edge.prompt import estimate_prompt_tokens
from services.edge.ratelimit.limiter import RateLimitConfig
from services.edge.ratelimit.redis_backend import RedisBackend
from services.edge.ratelimit.types import Ask, Verdict
from services.edge.tenancy.tenants import Limits
from tests.integration.conftest import MODEL, Stack
from tests.support.builders import TEST_ADMIN_TOKEN, edge_config
from tests.support.inproc import RunningEdge, start_edge
from tests.support.wait import eventually

PROMPT = [{"role": "user", "content": "Tell me about the weather in Seoul today."}]


@dataclass
class Pair:
    stack: Stack
    edges: tuple[RunningEdge, RunningEdge]
    redis_url: str

    async def key(self, tenant: str, **fields: Any) -> str:
        return await self.edges[0].new_key(tenant, **fields)


@pytest.fixture
async def pair(stack: Stack, redis_url: str) -> AsyncIterator[Pair]:
    second = await start_edge(redis_url=redis_url, router_address=stack.router.address)
    yield Pair(stack, (stack.edge, second), redis_url)
    await second.stop()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]


async def post(http: aiohttp.ClientSession, edge: RunningEdge, key: str, **body: Any) -> Answer:
    async with http.post(
        f"{edge.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": MODEL, "messages": PROMPT, **body},
    ) as resp:
        return Answer(resp.status, dict(resp.headers), await resp.json())


async def burst(pair: Pair, key: str, n: int = 100, **body: Any) -> list[Answer]:
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=60)
    ) as http:
        return list(
            await asyncio.gather(*(post(http, pair.edges[i % 2], key, **body) for i in range(n)))
        )


async def test_requests_per_minute_are_exact_across_replicas(pair: Pair) -> None:
    key = await pair.key("rpm", limits=Limits(rpm=7))
    answers = await burst(pair, key, max_tokens=2)
    ok = [a for a in answers if a.status == 200]
    refused = [a for a in answers if a.status == 429]
    assert (len(ok), len(refused)) == (7, 93)
    for a in refused:
        assert a.body["error"]["type"] == "rate_limit_error"
        assert int(a.headers["Retry-After"]) >= 1
        assert a.headers["x-ratelimit-limit-requests"] == "7"
        assert a.headers["x-ratelimit-remaining-requests"] == "0"
    remaining = sorted(int(a.headers["x-ratelimit-remaining-requests"]) for a in ok)
    assert remaining == list(range(7))  # each admission saw every earlier one


async def test_tokens_per_minute_are_never_overrun_by_more_than_one_reservation(
    pair: Pair,
) -> None:
    tpm = 300
    key = await pair.key("tpm", limits=Limits(tpm=tpm))
    answers = await burst(pair, key, max_tokens=12)
    ok = [a for a in answers if a.status == 200]
    assert ok
    used = sum(a.body["usage"]["total_tokens"] for a in ok)
    request = parse_chat_request(json.dumps({"model": MODEL, "messages": PROMPT}).encode())
    reservation = estimate_prompt_tokens(request) + 12
    assert used <= tpm + reservation
    assert len(ok) >= tpm // reservation  # and the limit was not undersold either
    refusals = [a for a in answers if a.status == 429]
    assert refusals
    assert all("tokens per minute" in a.body["error"]["message"] for a in refusals)
    assert all(a.headers["x-ratelimit-limit-tokens"] == str(tpm) for a in answers)


async def test_limits_stay_exact_when_the_edge_stalls_past_its_redis_timeout(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edge's own event loop stalls (a long GC pass, a starved CPU) for longer than its
    Redis timeout while admissions are in flight. The replies only waited for the loop: Redis
    did not fail, so the edge must not open its breaker and fall back to its own windows,
    which would overrun the tenant's limit across the two replicas."""
    stalled = False
    admit = RedisBackend.admit

    async def admit_then_stall(self: RedisBackend, ask: Ask, now_ms: int) -> Verdict:
        nonlocal stalled
        call = asyncio.ensure_future(admit(self, ask, now_ms))
        if not stalled:
            stalled = True
            await asyncio.sleep(0.005)  # the script is sent (and answered) ...
            time.sleep(1.5)  # noqa: ASYNC251  # ... and the loop stalls past the 1 s timeout
        return await call

    monkeypatch.setattr(RedisBackend, "admit", admit_then_stall)
    tpm = 300
    key = await pair.key("stall", limits=Limits(tpm=tpm))
    answers = await burst(pair, key, max_tokens=12)
    assert stalled
    ok = [a for a in answers if a.status == 200]
    used = sum(a.body["usage"]["total_tokens"] for a in ok)
    request = parse_chat_request(json.dumps({"model": MODEL, "messages": PROMPT}).encode())
    assert used <= tpm + estimate_prompt_tokens(request) + 12
    # Nothing else failed either: the in-process router heard nothing from its workers during
    # the stall, and must not have called them down for it.
    assert [a.body for a in answers if a.status not in (200, 429)] == []
    counters = [e.server.counters for e in pair.edges]
    assert sum(c.redis_timeouts_in_stalls for c in counters) >= 1  # the stall was seen ...
    assert sum(c.limiter_fail_open for c in counters) == 0  # ... and not held against Redis
    assert sum(c.redis_breaker_opened for c in counters) == 0


async def test_concurrent_streams_are_exact_across_replicas_and_freed_on_disconnect(
    pair: Pair,
) -> None:
    key = await pair.key("streams", limits=Limits(max_streams=5))
    body = {"model": MODEL, "messages": PROMPT, "stream": True, "max_tokens": 5000}
    body["ignore_eos"] = True
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def open_stream(i: int) -> aiohttp.ClientResponse:
            return await http.post(
                f"{pair.edges[i % 2].url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json=body,
            )

        responses = await asyncio.gather(*(open_stream(i) for i in range(100)))
        try:
            statuses = [r.status for r in responses]
            assert statuses.count(200) == 5
            assert statuses.count(429) == 95
        finally:
            for r in responses:
                r.close()  # the admitted clients go away mid-stream
    client = aioredis.Redis.from_url(pair.redis_url)

    async def leases() -> int:
        return sum([await client.zcard(k) for k in await client.keys("meridian:rl:*:c")])

    try:
        for _ in range(200):
            if await leases() == 0:
                break
            await asyncio.sleep(0.02)
        assert await leases() == 0  # every slot was released, none left to expire
    finally:
        await client.aclose()
    await eventually(lambda: all(e.server.limiter.live_leases == 0 for e in pair.edges))
    async with aiohttp.ClientSession() as http:
        again = await post(http, pair.edges[1], key, max_tokens=2)
    assert again.status == 200


async def test_successful_responses_carry_rate_limit_headers(pair: Pair) -> None:
    key = await pair.key("headers", limits=Limits(rpm=50, tpm=10_000))
    async with aiohttp.ClientSession() as http:
        answer = await post(http, pair.edges[0], key, max_tokens=3)
    assert answer.status == 200
    assert answer.headers["x-ratelimit-limit-requests"] == "50"
    assert answer.headers["x-ratelimit-remaining-requests"] == "49"
    assert answer.headers["x-ratelimit-limit-tokens"] == "10000"
    assert int(answer.headers["x-ratelimit-remaining-tokens"]) < 10_000
    assert answer.headers["x-ratelimit-reset-requests"].endswith("s")


async def test_per_key_limits_apply_under_the_tenant_limits(pair: Pair) -> None:
    key_a = await pair.key("shared", limits=Limits(rpm=3), key_limits=Limits(rpm=2))
    key_b, _ = await pair.edges[0].directory.create_key("shared")
    async with aiohttp.ClientSession() as http:
        a = [await post(http, pair.edges[i % 2], key_a, max_tokens=2) for i in range(3)]
        b = [await post(http, pair.edges[i % 2], key_b, max_tokens=2) for i in range(2)]
    assert [x.status for x in a] == [200, 200, 429]  # the key's own limit
    assert "on key" in a[2].body["error"]["message"]
    assert [x.status for x in b] == [200, 429]  # the tenant's: 3 in all
    assert "on tenant shared" in b[1].body["error"]["message"]


async def admin_patch(edge: RunningEdge, tenant: str, body: dict[str, Any]) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.patch(
            f"{edge.admin_url}/admin/tenants/{tenant}",
            headers={"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"},
            json=body,
        ) as resp,
    ):
        return resp.status


async def test_raising_the_rpm_of_a_throttled_tenant_takes_effect_at_once(stack: Stack) -> None:
    edge = stack.edge
    key = await edge.new_key("throttled", limits=Limits(rpm=2))
    async with aiohttp.ClientSession() as http:
        answers = [await post(http, edge, key, max_tokens=2) for _ in range(3)]
        assert [a.status for a in answers] == [200, 200, 429]
        assert "Limit 2, Used 2, Requested 1" in answers[2].body["error"]["message"]
        seen = edge.counters.auth_invalidations
        assert await admin_patch(edge, "throttled", {"limits": {"rpm": 100}}) == 200
        await eventually(lambda: edge.counters.auth_invalidations > seen)  # the new limit
        after = await post(http, edge, key, max_tokens=2)
    assert after.status == 200, after.body  # not the refusal remembered under rpm=2
    assert after.headers["x-ratelimit-limit-requests"] == "100"
    assert after.headers["x-ratelimit-remaining-requests"] == "97"


async def test_min_tokens_without_max_tokens_is_reserved_and_refused_as_too_large(
    stack: Stack,
) -> None:
    key = await stack.edge.new_key("tpm", limits=Limits(tpm=2000))
    async with aiohttp.ClientSession() as http:
        by_min = await post(http, stack.edge, key, min_tokens=8000)
        by_max = await post(http, stack.edge, key, max_tokens=8000)
        small = await post(http, stack.edge, key, min_tokens=2)
    for refused in (by_min, by_max):
        assert refused.status == 429, refused.body
        assert refused.body["error"]["message"].startswith(
            "Request too large for tokens per minute (TPM) on tenant tpm"
        )
        assert "Limit 2000, Requested 80" in refused.body["error"]["message"]
    assert small.status == 200, small.body  # the default budget (1024) still fits
    assert stack.edge.counters.rate_limited_too_large == 2
    assert by_min.headers["x-should-retry"] == "false"


async def test_the_openai_sdk_does_not_retry_a_request_larger_than_the_tpm(stack: Stack) -> None:
    key = await stack.edge.new_key("tpm-sdk", limits=Limits(tpm=2000))
    # The SDK's default: two retries with backoff for any 429 not marked otherwise.
    async with openai.AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=2) as api:
        with pytest.raises(openai.RateLimitError) as refused:
            await api.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8000
            )
    assert "Request too large" in refused.value.message
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert stack.edge.counters.rate_limited_too_large == 1  # one attempt, not three


async def test_without_max_tokens_a_token_limited_request_generates_no_more_than_it_reserved(
    stack: Stack, redis_url: str
) -> None:
    """Without max_tokens, the reservation is the default completion budget; a worker left to
    itself generates up to the model's context, many times that, and the tenant's tokens per
    minute were overspent several times over. Under a tpm, the default is the max_tokens the
    worker is sent; a key without a token limit still generates freely."""
    edge = await start_edge(
        redis_url=redis_url,
        router_address=stack.router.address,
        config=edge_config(ratelimit=RateLimitConfig(default_completion_tokens=4)),
    )
    try:
        limited = await edge.new_key("tpm-default", limits=Limits(tpm=100_000))
        free = await edge.new_key("no-tpm", limits=Limits(rpm=1000))
        async with aiohttp.ClientSession() as http:
            chat = await post(http, edge, limited)
            plain = await post(http, edge, free)
            async with http.post(
                f"{edge.url}/v1/completions",
                headers={"Authorization": f"Bearer {limited}"},
                json={"model": MODEL, "prompt": ["one", "two"], "max_tokens": None},
            ) as resp:
                completions = Answer(resp.status, dict(resp.headers), await resp.json())
        assert chat.status == 200, chat.body
        assert chat.body["usage"]["completion_tokens"] == 4
        assert chat.body["choices"][0]["finish_reason"] == "length"
        assert plain.status == 200, plain.body
        assert plain.body["usage"]["completion_tokens"] > 4  # the sim writes 8..24 tokens
        assert completions.status == 200, completions.body
        assert completions.body["usage"]["completion_tokens"] == 8  # 4 for each prompt
        assert all(c["finish_reason"] == "length" for c in completions.body["choices"])
    finally:
        await edge.stop()
