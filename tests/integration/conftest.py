"""A three-region stack in the test's event loop: simulated workers behind real delay proxies,
a router watching the proxied addresses, and the edge — all over real sockets."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from services.common.clock import SYSTEM_CLOCK, Clock
from services.edge.server import EdgeConfig
from services.netem.config import LinkProfile, Route
from services.netem.proxy import DelayProxy
from services.worker.sim import SimConfig, SimEngine
from tests.support.inproc import (
    RunningEdge,
    RunningRouter,
    RunningWorker,
    start_edge,
    start_router,
    start_worker,
)

MODEL = "meridian-sim"
# One-way delays; the router measures twice these as RTT.
REGIONS = {"kr": 2.0, "jp": 15.0, "us": 40.0}


def sim_config(**over: object) -> SimConfig:
    base: dict[str, object] = {
        "models": [MODEL],
        "time_scale": 0.2,
        "output_len_min": 8,
        "output_len_max": 24,
    }
    base.update(over)
    return SimConfig.from_mapping(base)


@dataclass
class Stack:
    workers: dict[str, RunningWorker]
    proxies: dict[str, DelayProxy]
    router: RunningRouter
    edge: RunningEdge
    key: str

    @property
    def base_url(self) -> str:
        return f"{self.edge.url}/v1"


async def start_stack(
    redis_url: str,
    *,
    clock: Clock = SYSTEM_CLOCK,
    stale_after_s: float = 0.5,
    edge_config: EdgeConfig | None = None,
    **sim: object,
) -> Stack:
    """The stack; ``clock`` is the edge's (a ``ManualClock`` makes its TTLs, breaker and
    limit windows move only when the test says so); ``edge_config`` replaces the test edge's
    default config. ``stale_after_s`` is the router's load-report staleness limit: tests
    about something else (Redis failover) raise it, since one event loop runs every service
    and a loaded machine can hold it up for a second."""
    workers: dict[str, RunningWorker] = {}
    proxies: dict[str, DelayProxy] = {}
    async with contextlib.AsyncExitStack() as started:  # a failed start stops what it started
        for region, one_way_ms in REGIONS.items():
            name = f"{region}-1"
            w = await start_worker(SimEngine(sim_config(**sim)), worker_id=name, region=region)
            started.push_async_callback(w.stop)
            host, port = w.address.rsplit(":", 1)
            proxy = DelayProxy(
                Route(
                    name=name,
                    upstream_host=host,
                    upstream_port=int(port),
                    link=LinkProfile(delay_ms=one_way_ms),
                )
            )
            await proxy.start()
            started.push_async_callback(proxy.close)
            workers[name] = w
            proxies[name] = proxy
        router = await start_router(
            [f"{p.host}:{p.port}" for p in proxies.values()], stale_after_s=stale_after_s
        )
        started.push_async_callback(router.stop)
        await router.wait_healthy(len(workers))
        edge = await start_edge(
            redis_url=redis_url, router_address=router.address, clock=clock, config=edge_config
        )
        started.push_async_callback(edge.stop)
        key = await edge.new_key("acme")
        started.pop_all()  # up: from here stop_stack stops it
    return Stack(workers, proxies, router, edge, key)


async def stop_stack(stack: Stack) -> None:
    await stack.edge.stop()
    await stack.router.stop()
    for proxy in stack.proxies.values():
        await proxy.close()
    for w in stack.workers.values():
        await w.stop()


@pytest.fixture
async def stack(redis_url: str) -> AsyncIterator[Stack]:
    s = await start_stack(redis_url)
    yield s
    await stop_stack(s)
