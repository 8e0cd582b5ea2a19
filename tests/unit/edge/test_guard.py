"""The connection guard's parts: occupancy caps, per-IP token buckets, and the chat stage
(through a real aiohttp server, with a terminal stage that holds requests open)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from services.common.clock import ManualClock
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.guard import GuardConfig, IpBuckets, Lifecycle, Occupancy, Refusal
from services.edge.middleware.error_boundary import error_boundary
from services.edge.pipeline import build_chain
from services.edge.stages.connection_guard import ConnectionGuard
from tests.support.wait import eventually


def test_occupancy_caps_each_ip_and_the_total() -> None:
    occ = Occupancy(max_total=3, max_per_ip=2)
    assert occ.try_acquire("a") is None
    assert occ.try_acquire("a") is None
    assert occ.try_acquire("a") is Refusal.IP
    assert occ.try_acquire("b") is None
    assert occ.try_acquire("c") is Refusal.EDGE
    occ.release("a")
    assert occ.held_by("a") == 1
    assert occ.total == 2
    assert occ.try_acquire("c") is None
    for ip in ("a", "b", "c", "c"):
        occ.release(ip)  # releasing more than held never goes negative
    assert occ.total == 0
    assert occ.held_by("c") == 0


def test_ip_buckets_allow_a_burst_then_the_sustained_rate() -> None:
    clock = ManualClock()
    buckets = IpBuckets(rate=2.0, burst=3, clock=clock)
    assert [buckets.take("1.2.3.4") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("1.2.3.4") == pytest.approx(0.5)
    assert buckets.take("5.6.7.8") == 0.0  # another address has its own bucket
    clock.advance(0.5)
    assert buckets.take("1.2.3.4") == 0.0
    assert buckets.take("1.2.3.4") > 0


def test_ip_buckets_forget_idle_addresses_when_full() -> None:
    clock = ManualClock()
    buckets = IpBuckets(rate=1.0, burst=1, clock=clock, max_ips=4)
    for i in range(4):
        buckets.take(f"10.0.0.{i}")
    clock.advance(10)  # every bucket has refilled: nothing worth remembering
    assert buckets.take("10.0.1.1") == 0.0
    assert buckets.take("10.0.0.0") == 0.0  # forgotten, so a full bucket again


def test_a_zero_rate_turns_the_bucket_off() -> None:
    buckets = IpBuckets(rate=0.0, burst=1, clock=ManualClock())
    assert all(buckets.take("x") == 0.0 for _ in range(1000))


@pytest.mark.parametrize(
    "bad", [{"max_streams": 0}, {"header_timeout_s": 0}, {"ip_requests_per_s": -1}]
)
def test_bad_guard_config_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        GuardConfig(**bad)  # type: ignore[arg-type]


@dataclass
class Holding:
    """A terminal stage that keeps each request open until released."""

    entered: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    name: str = "stream"

    async def __call__(self, ctx: ChatContext) -> web.StreamResponse:
        self.entered += 1
        await self.release.wait()
        return web.json_response({"ok": True})


@dataclass
class GuardedApp:
    url: str
    holding: Holding
    streams: Occupancy
    lifecycle: Lifecycle
    counters: EdgeCounters


@asynccontextmanager
async def serve_guarded(*, max_total: int, max_per_ip: int) -> AsyncIterator[GuardedApp]:
    counters, lifecycle = EdgeCounters(), Lifecycle()
    streams = Occupancy(max_total=max_total, max_per_ip=max_per_ip)
    holding = Holding()
    chain = build_chain(
        [ConnectionGuard(streams=streams, lifecycle=lifecycle, counters=counters)], holding
    )

    async def handle(request: web.Request) -> web.StreamResponse:
        return await chain(ChatContext(request=request, request_id="r"))

    app = web.Application(middlewares=[error_boundary])
    app.router.add_post("/chat", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield GuardedApp(
        f"http://127.0.0.1:{runner.addresses[0][1]}/chat", holding, streams, lifecycle, counters
    )
    holding.release.set()
    await runner.cleanup()


@pytest.fixture
async def guarded() -> AsyncIterator[GuardedApp]:
    async with serve_guarded(max_total=3, max_per_ip=2) as app:
        yield app


async def test_concurrent_streams_per_ip_are_capped_and_freed(guarded: GuardedApp) -> None:
    async with aiohttp.ClientSession() as http:
        held = [asyncio.create_task(http.post(guarded.url)) for _ in range(2)]
        await eventually(lambda: guarded.holding.entered == 2)
        async with http.post(guarded.url) as refused:
            assert refused.status == 429
            assert refused.headers["Retry-After"] == "1"
            assert (await refused.json())["error"]["type"] == "rate_limit_error"
        assert guarded.counters.streams_refused_ip == 1
        guarded.holding.release.set()
        for task in held:
            (await task).close()
        await eventually(lambda: guarded.streams.total == 0)
        async with http.post(guarded.url) as again:
            assert again.status == 200


async def test_a_draining_edge_refuses_new_chat_requests(guarded: GuardedApp) -> None:
    guarded.lifecycle.draining = True
    async with aiohttp.ClientSession() as http, http.post(guarded.url) as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "unavailable"
    assert guarded.counters.refused_while_draining == 1
    assert guarded.holding.entered == 0


async def test_the_edge_wide_stream_cap_answers_503() -> None:
    async with serve_guarded(max_total=1, max_per_ip=5) as app, aiohttp.ClientSession() as http:
        held = asyncio.create_task(http.post(app.url))
        await eventually(lambda: app.holding.entered == 1)
        async with http.post(app.url) as refused:
            assert refused.status == 503
            assert (await refused.json())["error"]["type"] == "overloaded_error"
        assert app.counters.streams_refused_edge == 1
        app.holding.release.set()
        (await held).close()
