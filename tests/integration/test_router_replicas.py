"""Two router replicas (one per edge site) watching the same workers: they share nothing but
the workers, so each has its own network view, its own in-flight accounting, its own affinity
tables and decision journal — and one going away does not disturb the other.

Each replica reaches the workers through its own delay proxies: Seoul is next to kr and far
from us, Oregon the reverse, as the real sites would be.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from meridian.v1 import router_pb2
from services.common.clock import SYSTEM_CLOCK
from services.router.debug import DebugConfig
from services.worker.sim import SimEngine
from tests.support.inproc import RunningRouter, RunningWorker, start_router, start_worker
from tests.support.regions import Refused, RouterCaller, delay_proxy, sim
from tests.support.wait import eventually

# one-way delay from each site to each region
SITES = {"seoul": {"kr": 1.0, "us": 40.0}, "oregon": {"kr": 40.0, "us": 1.0}}


@dataclass
class Replicas:
    workers: dict[str, RunningWorker]
    routers: dict[str, RunningRouter]
    callers: dict[str, RouterCaller]


@pytest.fixture
async def replicas() -> AsyncIterator[Replicas]:
    async with contextlib.AsyncExitStack() as started:  # stops all, however far start got
        workers: dict[str, RunningWorker] = {}
        for r in ("kr", "us"):
            workers[r] = await start_worker(SimEngine(sim()), worker_id=f"{r}-1", region=r)
            started.push_async_callback(workers[r].stop)
        routers: dict[str, RunningRouter] = {}
        for site, delays in SITES.items():
            site_proxies = []
            for r in ("kr", "us"):
                proxy = await delay_proxy(workers[r], delays[r])
                started.push_async_callback(proxy.close)
                site_proxies.append(proxy)
            routers[site] = await start_router(
                [f"{p.host}:{p.port}" for p in site_proxies],
                site=site,
                report_interval_ms=1000,  # assignments stay visible between reports
                debug=DebugConfig(),
            )
            started.push_async_callback(routers[site].stop)
        for router in routers.values():
            await router.wait_healthy(2)
        callers: dict[str, RouterCaller] = {}
        for site, router in routers.items():
            callers[site] = RouterCaller(router.address, edge_site=site)
            started.push_async_callback(callers[site].close)
        yield Replicas(workers, routers, callers)


async def route(
    caller: RouterCaller, *, follow_up: bool = False, **fields: object
) -> router_pb2.RouteResponse:
    resp = await caller.route(follow_up=follow_up, **fields)
    assert not isinstance(resp, Refused), resp
    return resp


def in_flight(router: RunningRouter, worker_id: str) -> int:
    snaps = {s.worker_id: s for s in router.fleet.snapshots(SYSTEM_CLOCK.monotonic())}
    return snaps[worker_id].in_flight


async def test_each_replica_routes_by_its_own_network_view(replicas: Replicas) -> None:
    seoul = await route(replicas.callers["seoul"])
    oregon = await route(replicas.callers["oregon"])
    assert seoul.router_site == "seoul"
    assert seoul.candidates[0].region == "kr"
    assert oregon.router_site == "oregon"
    assert oregon.candidates[0].region == "us"


async def test_debug_views_show_each_replicas_own_rtt(replicas: Replicas) -> None:
    rtt: dict[str, dict[str, float]] = {}
    async with aiohttp.ClientSession() as http:
        for site, router in replicas.routers.items():
            async with http.get(f"{router.debug_url}/debug/view") as resp:
                view = await resp.json()
            assert view["router_site"] == site
            rtt[site] = {w["region"]: w["rtt_ms"] for w in view["workers"]}
    assert rtt["seoul"]["kr"] < rtt["seoul"]["us"]
    assert rtt["oregon"]["us"] < rtt["oregon"]["kr"]
    debug_ports = {r.debug.port for r in replicas.routers.values() if r.debug}
    assert len(debug_ports) == 2


async def test_in_flight_accounting_is_per_replica(replicas: Replicas) -> None:
    seoul, oregon = replicas.routers["seoul"], replicas.routers["oregon"]

    async def seoul_counts_its_own() -> bool:
        await route(replicas.callers["seoul"], follow_up=True)  # as if Generate followed
        return in_flight(seoul, "kr-1") >= 1

    # Between two load reports (1 s apart here) Seoul counts what it sent; Oregon never sees it.
    for _ in range(50):
        if await seoul_counts_its_own():
            break
    assert in_flight(seoul, "kr-1") >= 1
    assert in_flight(oregon, "kr-1") == 0


async def test_affinity_and_journals_are_per_replica(replicas: Replicas) -> None:
    hashes = [11, 22, 33, 44]
    first = await route(replicas.callers["seoul"], prefix_hashes=hashes)
    again = await route(replicas.callers["seoul"], prefix_hashes=hashes, explain=True)
    other = await route(replicas.callers["oregon"], prefix_hashes=hashes, explain=True)

    def prefix_detail(resp: router_pb2.RouteResponse, worker_id: str) -> str:
        cand = next(c for c in resp.candidates if c.worker_id == worker_id)
        return next(c.detail for c in cand.contributions if c.signal == "prefix-affinity")

    winner = first.candidates[0].worker_id
    assert prefix_detail(again, winner) == "prefix=4/4 blocks"  # Seoul remembers
    assert prefix_detail(other, winner) == "prefix=0/4 blocks"  # Oregon never saw it
    ids = {
        site: {e.decision_id for e in r.service.journal.recent(100)}
        for site, r in replicas.routers.items()
    }
    assert first.decision_id in ids["seoul"]
    assert other.decision_id in ids["oregon"]
    assert not ids["seoul"] & ids["oregon"]


async def test_one_replica_going_away_does_not_disturb_the_other(replicas: Replicas) -> None:
    await replicas.routers["seoul"].stop()
    served = await replicas.callers["oregon"].ask(
        [{"role": "user", "content": "still there?"}], max_tokens=3
    )
    assert not isinstance(served, Refused)
    assert served.region == "us"
    oregon = replicas.routers["oregon"]
    await eventually(
        lambda: all(s.healthy for s in oregon.fleet.snapshots(SYSTEM_CLOCK.monotonic()))
    )


def shared(router: RunningRouter, worker_id: str) -> bool:
    snaps = {s.worker_id: s for s in router.fleet.snapshots(SYSTEM_CLOCK.monotonic())}
    return snaps[worker_id].shared


async def test_each_replica_tells_from_the_admissions_whether_another_one_sends(
    replicas: Replicas,
) -> None:
    """The worker's load reports name the decision ids it admitted; each replica knows its
    own by their prefix. Seoul's request served on kr-1 leaves kr-1 Seoul's alone (its
    in-flight count there is exact) and shared for Oregon; us-1, which no one has sent to, is
    shared for neither; Oregon sending to kr-1 too makes it shared for Seoul."""
    seoul, oregon = replicas.routers["seoul"], replicas.routers["oregon"]
    assert seoul.fleet.id_prefix != oregon.fleet.id_prefix
    served = await replicas.callers["seoul"].ask([{"role": "user", "content": "hi"}])
    assert not isinstance(served, Refused)
    assert served.region == "kr"
    await eventually(lambda: shared(oregon, "kr-1"), timeout_s=5.0)
    assert not shared(seoul, "kr-1")
    assert not shared(seoul, "us-1")
    assert not shared(oregon, "us-1")
    served = await replicas.callers["oregon"].ask(
        [{"role": "user", "content": "hi"}], allowed_regions=["kr"]
    )
    assert not isinstance(served, Refused)
    assert served.region == "kr"
    await eventually(lambda: shared(seoul, "kr-1"), timeout_s=5.0)
