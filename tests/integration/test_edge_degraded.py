"""Acceptance: degraded modes, each counted, each recovering without a restart.

- Redis stopped mid-run (a Redis of this test's own, restarted on the same port with its data):
  an edge that fails open keeps serving recently verified keys with local limits and refuses
  keys it cannot check; an edge that fails closed answers 503; both recover when Redis returns.
- Router stopped mid-run: the edge routes from the router's last view (residency included),
  and goes back to the router when it returns at the same address.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from services.common.clock import ManualClock
from services.edge.ratelimit.limiter import FailureMode, RateLimitConfig
from services.edge.tenancy.tenants import Limits
from tests.integration.conftest import MODEL, Stack, start_stack, stop_stack
from tests.support.builders import edge_config
from tests.support.inproc import RunningEdge, start_edge, start_router
from tests.support.redis_proc import RedisProcess
from tests.support.wait import eventually

HELLO = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


async def ask(edge: RunningEdge, key: str, **body: object) -> tuple[int, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{edge.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={**HELLO, **body},
        ) as resp,
    ):
        await resp.read()
        return resp.status, dict(resp.headers)


@dataclass
class RedisOutage:
    server: RedisProcess
    stack: Stack
    closed: RunningEdge  # fails closed; stack.edge fails open
    clock: ManualClock  # both edges': cache TTLs and the breaker move only when told

    async def stop_redis(self) -> None:
        await self.stack.edge.redis.save()  # the restarted server comes back with its data
        self.server.stop()

    def start_redis(self) -> None:
        self.server.start()


@pytest.fixture
async def outage(tmp_path: Path) -> AsyncIterator[RedisOutage]:
    server = RedisProcess(tmp_path / "redis")
    server.start()
    clock = ManualClock()
    stack = await start_stack(server.url, clock=clock)
    closed = await start_edge(
        redis_url=server.url,
        router_address=stack.router.address,
        clock=clock,
        config=edge_config(
            ratelimit=RateLimitConfig(failure_mode=FailureMode.CLOSED),
        ),
    )
    yield RedisOutage(server, stack, closed, clock)
    await closed.stop()
    await stop_stack(stack)
    server.stop()


async def test_redis_down_fail_open_serves_known_keys_with_local_limits_then_recovers(
    outage: RedisOutage,
) -> None:
    edge = outage.stack.edge
    limited = await edge.new_key("limited", limits=Limits(rpm=5))
    unknown = await edge.new_key("acme")  # exists, but this edge never verified it
    assert (await ask(edge, outage.stack.key))[0] == 200
    assert (await ask(edge, limited))[0] == 200  # 1 of 5 in Redis's window
    await outage.stop_redis()
    outage.clock.advance(2.1)  # past the fresh cache TTL: the keys are served stale now

    assert (await ask(edge, outage.stack.key))[0] == 200  # verified recently: still served
    statuses = [(await ask(edge, limited))[0] for _ in range(7)]
    assert statuses == [200] * 5 + [429] * 2  # a fresh local window of 5
    assert (await ask(edge, unknown))[0] == 503  # cannot be checked
    counters = edge.counters
    assert counters.limiter_fail_open == 7
    assert counters.auth_stale_served >= 1
    assert counters.auth_unavailable == 1

    outage.start_redis()
    outage.clock.advance(1.1)  # the breaker's open period: the next call tries Redis again
    assert (await ask(edge, unknown))[0] == 200
    # The 5 the outage admitted are charged to Redis's window: with the 1 from before, the
    # key has used its 5 for this minute, and Redis refuses it until they leave the window.
    await eventually(lambda: counters.limiter_charged_back == 5, timeout_s=10)
    fail_open = counters.limiter_fail_open
    status, headers = await ask(edge, limited)
    assert status == 429
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert counters.limiter_fail_open == fail_open  # Redis decided it
    outage.clock.advance(61)  # the window has moved past all six
    statuses = [(await ask(edge, limited))[0] for _ in range(6)]
    assert statuses == [200] * 5 + [429]  # Redis's window again, a fresh 5


async def readiness(edge: RunningEdge) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as http, http.get(f"{edge.url}/readyz") as resp:
        return resp.status, await resp.json()


async def test_redis_down_keeps_a_fail_open_edge_ready_and_degraded_and_a_closed_one_not(
    outage: RedisOutage,
) -> None:
    """A load balancer must keep sending to an edge that still serves: in open mode an edge
    without Redis serves the keys it knows, so /readyz stays 200 (saying so); closed, 503."""
    for edge in (outage.stack.edge, outage.closed):
        assert await readiness(edge) == (
            200, {"status": "ready", "checks": {"redis": True, "router": True}}
        )  # fmt: skip
    await outage.stop_redis()
    assert await readiness(outage.stack.edge) == (
        200,
        {"status": "ready", "checks": {"redis": False, "router": True}, "degraded": ["redis"]},
    )
    assert await readiness(outage.closed) == (
        503, {"status": "not ready", "checks": {"redis": False, "router": True}}
    )  # fmt: skip
    outage.start_redis()
    outage.clock.advance(1.1)

    for _ in range(100):  # the redis client reconnects on its own; a few tries at most
        answers = [await readiness(e) for e in (outage.stack.edge, outage.closed)]
        if all(a[0] == 200 and "degraded" not in a[1] for a in answers):
            break
        await asyncio.sleep(0.05)
    assert answers == [(200, {"status": "ready", "checks": {"redis": True, "router": True}})] * 2


async def test_redis_down_fail_closed_answers_503_then_recovers(outage: RedisOutage) -> None:
    edge = outage.closed
    limited = await edge.new_key("limited", limits=Limits(rpm=100))
    assert (await ask(edge, limited))[0] == 200
    await outage.stop_redis()
    outage.clock.advance(2.1)  # past the fresh cache TTL: only Redis could vouch for the key
    status, headers = await ask(edge, limited)
    assert status == 503
    assert headers["Retry-After"] == "1"
    status, _ = await ask(edge, outage.stack.key)
    assert status == 503
    assert edge.counters.auth_unavailable >= 1
    outage.start_redis()
    outage.clock.advance(1.1)  # the breaker's open period
    assert (await ask(edge, limited))[0] == 200
    assert (await ask(edge, outage.stack.key))[0] == 200


async def test_fail_closed_refuses_limited_requests_even_with_a_fresh_key(
    outage: RedisOutage,
) -> None:
    edge = outage.closed
    limited = await edge.new_key("limited", limits=Limits(rpm=100))
    assert (await ask(edge, limited))[0] == 200
    await outage.stop_redis()
    assert (await ask(edge, limited))[0] == 503  # the key is cached; the limit cannot be
    assert edge.counters.limiter_fail_closed == 1
    outage.start_redis()


async def test_router_down_routes_from_the_last_view_then_recovers(stack: Stack) -> None:
    edge = stack.edge
    # The view the edge keeps (refreshed every 2 s anyway), taken when every worker is healthy
    # in it: on a loaded machine a load report can be late and a worker briefly stale.
    for _ in range(100):
        await edge.server.router.refresh()
        view = edge.server.router._usable_view()  # the copy under test
        if view is not None and sum(w.healthy for w in view.workers) == len(stack.workers):
            break
        await asyncio.sleep(0.05)
    jp_only = await edge.new_key("jp-only", allowed_regions=("jp",))
    await stack.router.stop()

    status, headers = await ask(edge, stack.key)
    assert status == 200
    assert headers["x-meridian-region"] == "kr"  # nearest and idle, as the router would say
    status, headers = await ask(edge, jp_only)
    assert (status, headers["x-meridian-region"]) == (200, "jp")  # residency still holds
    assert edge.counters.route_fallback_used == 2
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{stack.base_url}/models", headers={"Authorization": f"Bearer {stack.key}"}
        ) as resp,
    ):
        assert resp.status == 200
        assert [m["id"] for m in (await resp.json())["data"]] == [MODEL]

    workers = [f"{p.host}:{p.port}" for p in stack.proxies.values()]
    restarted = await start_router(workers, listen=stack.router.address)
    try:
        used = edge.counters.route_fallback_used

        async def routed_by_router() -> bool:
            before = edge.counters.route_fallback_used
            status, _ = await ask(edge, stack.key)
            return status == 200 and edge.counters.route_fallback_used == before

        for _ in range(100):
            if await routed_by_router():
                break
            await asyncio.sleep(0.1)
        assert await routed_by_router()
        assert edge.counters.route_fallback_used >= used
    finally:
        await restarted.stop()


async def test_router_down_without_a_view_is_503(redis_url: str, stack: Stack) -> None:
    await stack.router.stop()
    fresh = await start_edge(redis_url=redis_url, router_address=stack.router.address)
    try:
        await eventually(lambda: fresh.counters.view_refresh_failures >= 1)
        status, _ = await ask(fresh, stack.key)
        assert status == 503
        assert fresh.counters.route_fallback_unavailable == 1
    finally:
        await fresh.stop()


async def test_a_redis_cluster_with_no_reachable_node_is_503_not_500() -> None:
    """redis-py's "Redis Cluster cannot be connected" (every seed node down, at start or on
    a re-initialisation) is not a RedisError: every caller must still take it as Redis down."""
    from services.common.net import free_port
    from tests.support.builders import TEST_ADMIN_TOKEN

    edge = await start_edge(
        redis_url=f"redis+cluster://127.0.0.1:{free_port()}", router_address="127.0.0.1:1"
    )
    try:
        status, headers = await ask(edge, "mk-" + "a" * 43)
        assert (status, headers["Retry-After"]) == (503, "1")
        async with aiohttp.ClientSession() as http:
            async with http.get(
                f"{edge.admin_url}/admin/tenants",
                headers={"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"},
            ) as resp:
                assert resp.status == 503, await resp.text()
                assert "cannot reach Redis" in (await resp.json())["error"]["message"]
            async with http.get(f"{edge.url}/readyz") as resp:
                assert resp.status in (200, 503)  # the router is absent: not ready either way
                assert (await resp.json())["checks"]["redis"] is False
    finally:
        await edge.stop()
