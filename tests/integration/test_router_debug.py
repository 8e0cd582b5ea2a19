"""The router's debug endpoint over real HTTP: bearer-token access, the live view, dry-run
decisions with per-signal contributions, the last N decisions and per-plugin timings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from meridian.v1 import router_pb2
from services.router.debug import DebugConfig
from tests.support.inproc import start_router
from tests.support.regions import MODEL, Regions, RegionSpec, RouterCaller, sim, start_regions

TOKEN = "debug-token-for-tests-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def regions() -> AsyncIterator[Regions]:
    r = await start_regions(
        [RegionSpec("kr", 1.0), RegionSpec("jp", 15.0)],
        config=sim(),
        site="seoul",
        debug=DebugConfig(token=TOKEN),
    )
    yield r
    await r.stop()


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    "headers",
    [None, {"Authorization": "Bearer wrong-token-000000000"}, {"Authorization": TOKEN}],
    ids=["missing", "wrong", "not-bearer"],
)
async def test_every_debug_path_needs_the_token(
    regions: Regions, headers: dict[str, str] | None
) -> None:
    for path in ("/debug/view", "/debug/route?model=m", "/debug/decisions", "/debug/timings"):
        async with (
            aiohttp.ClientSession() as http,
            http.get(regions.router.debug_url + path, headers=headers) as resp,
        ):
            assert resp.status == 401, path
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")


async def test_the_view_lists_every_worker_with_its_signals(regions: Regions) -> None:
    status, view = await get(f"{regions.router.debug_url}/debug/view", AUTH)
    assert status == 200
    assert (view["router_site"], view["profile"]) == ("seoul", "default")
    workers = {w["worker_id"]: w for w in view["workers"]}
    assert set(workers) == {"kr-1", "jp-1"}
    assert all(w["healthy"] and w["health_detail"] == "ok" for w in workers.values())
    assert workers["kr-1"]["rtt_ms"] < workers["jp-1"]["rtt_ms"]
    assert workers["kr-1"]["models"][0]["state"] == "ready"
    assert workers["kr-1"]["load"]["max_running"] > 0
    assert view["membership"] == {"static": sorted(regions.proxied(w) for w in workers)}


async def test_a_dry_run_decision_explains_itself_and_assigns_nothing(regions: Regions) -> None:
    url = f"{regions.router.debug_url}/debug/route?model={MODEL}&priority=high&explain=1"
    status, body = await get(url, AUTH)
    assert status == 200
    assert body["decision_id"] == ""
    assert body["query"]["priority"] == "high"
    top = body["candidates"][0]
    assert top["region"] == "kr"
    signals = {c["signal"]: c for c in top["contributions"]}
    assert signals["latency"]["detail"].startswith("rtt=")
    assert sum(c["weighted"] for c in top["contributions"]) == pytest.approx(top["score"], 1e-4)
    assert body["plugin_timings_us"]["total"] > 0
    assert regions.router.service.journal.recent(10) == []  # a dry run is not a decision


@pytest.mark.parametrize(
    ("query", "status", "check"),
    [
        ("allowed_regions=eu", 200, ("error", "grpc_status", "FAILED_PRECONDITION")),
        ("exclude=kr-1,jp-1", 200, ("error", "grpc_status", "UNAVAILABLE")),
        ("priority=urgent", 400, ("error", "param", "priority")),
        ("max_tokens=lots", 400, ("error", "param", "max_tokens")),
        ("session_id=s1", 400, ("error", "param", "session_id")),
    ],
)
async def test_dry_runs_answer_what_the_rpc_would(
    regions: Regions, query: str, status: int, check: tuple[str, str, str]
) -> None:
    got, body = await get(f"{regions.router.debug_url}/debug/route?model={MODEL}&{query}", AUTH)
    assert got == status
    outer, inner, expected = check
    assert body[outer][inner] == expected, body


async def test_a_dry_run_without_a_model_names_the_parameter(regions: Regions) -> None:
    status, body = await get(f"{regions.router.debug_url}/debug/route", AUTH)
    assert (status, body["error"]["param"]) == (400, "model")


async def test_recent_decisions_and_timings_follow_real_traffic(regions: Regions) -> None:
    caller = RouterCaller(regions.router.address)
    try:
        for i in range(3):
            await caller.ask([{"role": "user", "content": f"q{i}"}], max_tokens=2)
        refused = await caller.route(allowed_regions=["eu"], priority=router_pb2.PRIORITY_LOW)
    finally:
        await caller.close()
    base = regions.router.debug_url
    status, recent = await get(f"{base}/debug/decisions?n=2", AUTH)
    assert status == 200
    newest, previous = recent["decisions"]
    assert newest["error"]["grpc_status"] == "FAILED_PRECONDITION"
    assert newest["query"]["priority"] == "low"
    assert previous["decision_id"]
    assert previous["candidates"][0]["contributions"]
    assert refused

    status, timings = await get(f"{base}/debug/timings", AUTH)
    assert status == 200
    assert timings["decisions"] == 4
    assert timings["plugin_timings_us"]["total"]["decisions"] == 4
    assert {"latency", "admission", "framework"} <= set(timings["plugin_timings_us"])

    _, view = await get(f"{base}/debug/view", AUTH)
    assert sum(view["decisions"]["routed_by_region"].values()) == 3
    assert view["decisions"]["empty"] == {"region_not_allowed": {"low": 1}}

    status, body = await get(f"{base}/debug/decisions?n=0", AUTH)
    assert (status, body["error"]["param"]) == (400, "n")


async def test_a_loopback_endpoint_without_a_token_is_open() -> None:
    router = await start_router([], debug=DebugConfig())
    try:
        status, view = await get(f"{router.debug_url}/debug/view")
        assert status == 200
        assert view["workers"] == []
    finally:
        await router.stop()
