"""The router's acceptance scenarios on the real stack: simulated workers behind real delay
proxies (the router measures the distance), load that the router only learns from reports,
and a caller that does what the edge does (Route → Generate → ReportOutcome).

Each test states the behaviour; none asserts a wall-clock figure except the issue's
"within a second" (the detection paths behind it are deterministic: a broken stream, or a
report older than ``stale_after_s``=0.5 s). Performance figures are in bench/.
"""

from __future__ import annotations

import asyncio
import copy
import statistics
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
import yaml

from meridian.v1 import router_pb2
from services.netem.proxy import CutMode
from services.router.scheduling.profile import load_profile
from tests.support.inproc import start_edge
from tests.support.regions import (
    MODEL,
    Hold,
    Refused,
    Regions,
    RegionSpec,
    RouterCaller,
    Served,
    chat,
    sim,
    start_regions,
    until_running,
)
from tests.support.stalls import LoopStalls
from tests.support.wait import eventually

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PROFILE = REPO / "deploy/router/profiles/default.yaml"
# 10 engine steps a second: held streams cost little CPU while they keep a worker busy.
SLOW_STEPS = {"decode_base_ms": 100.0}


@pytest.fixture
async def caller_for() -> AsyncIterator[Any]:
    callers: list[RouterCaller] = []
    stacks: list[Regions] = []

    async def make(regions: Regions) -> RouterCaller:
        stacks.append(regions)
        caller = RouterCaller(regions.router.address)
        callers.append(caller)
        return caller

    yield make
    for c in callers:
        await c.close()
    for s in stacks:
        await s.stop()


def primary(resp: router_pb2.RouteResponse | Refused) -> str:
    assert isinstance(resp, router_pb2.RouteResponse), resp
    return resp.candidates[0].region


async def test_near_at_95_percent_loses_to_far_at_45_and_wins_when_both_are_light(
    caller_for: Any,
) -> None:
    regions = await start_regions(
        [RegionSpec("kr", 1.0), RegionSpec("jp", 30.0)],  # RTT 2 ms and 60 ms
        config=sim(max_num_seqs=20, **SLOW_STEPS),
    )
    caller = await caller_for(regions)
    assert primary(await caller.route()) == "kr"

    kr = await Hold.start(regions.workers["kr-1"].address, 19, tag="kr")  # 95 %
    jp = await Hold.start(regions.workers["jp-1"].address, 9, tag="jp")  # 45 %
    await until_running(regions, "kr-1", 19)
    await until_running(regions, "jp-1", 9)
    busy = await caller.route(explain=True)
    assert primary(busy) == "jp", busy
    assert isinstance(busy, router_pb2.RouteResponse)
    queue = {
        c.region: {s.signal: s.detail for s in c.contributions}["queue"] for c in busy.candidates
    }
    assert queue["jp"].startswith("slots=9+"), queue
    assert queue["kr"].startswith("slots=19+"), queue

    await kr.release()
    await jp.release()
    await eventually(lambda: regions.view()["kr-1"].running == 0, timeout_s=10.0)
    assert primary(await caller.route()) == "kr"


@pytest.mark.parametrize("how", ["killed", "partitioned"])
async def test_a_lost_region_loses_its_traffic_within_a_second(how: str, caller_for: Any) -> None:
    regions = await start_regions(
        [RegionSpec("kr", 1.0, workers=2), RegionSpec("jp", 15.0)], config=sim()
    )
    caller = await caller_for(regions)
    assert primary(await caller.route()) == "kr"

    loop = asyncio.get_running_loop()
    stalls = LoopStalls()
    lost_at = loop.time()
    for w in regions.in_region("kr"):
        if how == "killed":
            await w.die()
        else:  # the network to the region freezes: no reset, just silence
            regions.proxies[w.worker_id].cut(CutMode.BLACKHOLE, reset_existing=False)
    while True:
        resp = await caller.route()
        assert isinstance(resp, router_pb2.RouteResponse), resp
        if all(c.region != "kr" for c in resp.candidates):
            break
        if loop.time() - lost_at > 5.0:
            stalls.stop()
            pytest.fail(f"kr still a candidate 5 s after it was {how}")
        await asyncio.sleep(0.01)
    moved_after = loop.time() - lost_at
    held = stalls.stop()
    # The router, the workers and their proxies share this process's event loop: time the
    # loop itself lost (a starved CI machine: 1.28 s once, against ~0.5 s) is not the
    # router's detection time. It still has to happen, and soon.
    assert moved_after - held < 1.0, (
        f"kr still a candidate {moved_after:.2f}s after it was {how} "
        f"(the event loop was held up {held:.2f}s of it)"
    )
    served = await caller.ask(chat("You are terse.", "hello"))
    assert isinstance(served, Served)
    assert served.region == "jp"


async def test_a_residency_pinned_request_never_leaves_its_regions(caller_for: Any) -> None:
    regions = await start_regions(
        [RegionSpec("kr", 1.0), RegionSpec("jp", 15.0)],
        config=sim(max_num_seqs=4, **SLOW_STEPS),
    )
    caller = await caller_for(regions)
    pinned = await caller.ask(chat("You are terse.", "hi"), allowed_regions=["kr"])
    assert isinstance(pinned, Served)
    assert pinned.region == "kr"

    full = await Hold.start(regions.workers["kr-1"].address, 4, tag="kr")  # every slot taken
    try:
        await until_running(regions, "kr-1", 4)
        assert primary(await caller.route()) == "jp"  # unpinned traffic moves on
        for priority in (router_pb2.PRIORITY_STANDARD, router_pb2.PRIORITY_HIGH):
            refusal = await caller.route(allowed_regions=["kr"], priority=priority, explain=True)
            assert isinstance(refusal, Refused), refusal
            assert refusal.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refusal.retry_after_ms is not None
            assert refusal.retry_after_ms > 0
        nowhere = await caller.route(allowed_regions=["eu"])
        assert isinstance(nowhere, Refused)
        assert nowhere.code is grpc.StatusCode.FAILED_PRECONDITION
        assert "eu" in nowhere.details
    finally:
        await full.release()

    await regions.workers["kr-1"].die()
    await eventually(lambda: not regions.view()["kr-1"].healthy)
    dead = await caller.route(allowed_regions=["kr"])
    assert isinstance(dead, Refused)
    assert dead.code is grpc.StatusCode.UNAVAILABLE
    decisions = regions.router.service.journal.recent(100)
    pinned_ids = {d.query.request_id for d in decisions if d.query.allowed_regions == {"kr"}}
    assert pinned_ids
    for d in decisions:
        if d.query.request_id in pinned_ids:
            assert {c.worker.region for c in d.decision.ranked} <= {"kr"}


def tiered_profile() -> Any:
    """The default profile with tiers far apart, so a small simulated worker (10 slots) keeps
    four slots for HIGH: LOW is refused from 60 % load, STANDARD from 80 %."""
    doc = yaml.safe_load(DEFAULT_PROFILE.read_text())
    doc = copy.deepcopy(doc)
    for f in doc["profiles"]["default"]["filters"]:
        if f["type"] == "admission":
            f["params"]["thresholds"] = {"low": 0.6, "standard": 0.8, "high": 1.0}
    return load_profile(doc)


async def test_under_overload_the_high_tier_keeps_its_ttft_while_the_low_tier_is_shed(
    caller_for: Any,
) -> None:
    """The part of TTFT that routing controls is the wait in the engine's queue (network and
    prefill are the same either way): HIGH requests must be scheduled at the next engine step
    under overload as when calm, while LOW requests are refused with a retry-after."""
    regions = await start_regions(
        [RegionSpec("kr", 1.0, workers=2)],
        config=sim(max_num_seqs=10, decode_base_ms=20.0),
        scheduler=tiered_profile(),
        # This test is about admission: a CPU-starved box (24 clients in one event loop) must
        # not turn a late load report into "unhealthy".
        stale_after_s=2.0,
    )
    caller = await caller_for(regions)
    high = router_pb2.PRIORITY_HIGH
    low = router_pb2.PRIORITY_LOW

    async def highs(n: int) -> list[Served]:
        out = []
        for i in range(n):
            r = await caller.ask(chat("You are terse.", f"high {i}"), priority=high, max_tokens=4)
            assert isinstance(r, Served), f"HIGH refused: {r}"
            out.append(r)
        return out

    calm = await highs(6)

    stop = asyncio.Event()
    shed: list[Refused] = []
    served_low: list[Served] = []

    async def low_client(i: int) -> None:
        while not stop.is_set():
            r = await caller.ask(chat("batch", f"low {i}"), priority=low, max_tokens=24)
            if isinstance(r, Refused):
                shed.append(r)
                await asyncio.sleep(0.05)  # a client honouring retry-after, sped up
            else:
                served_low.append(r)

    flood = [asyncio.create_task(low_client(i)) for i in range(24)]
    try:
        await eventually(lambda: len(shed) >= 10 and len(served_low) >= 10, timeout_s=20.0)
        loaded = await highs(6)
    finally:
        stop.set()
        await asyncio.gather(*flood)

    others = [r for r in shed if r.code is not grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert not others, others[:3]
    assert all(r.retry_after_ms for r in shed)
    step_ms = 20.0 + 0.15 * 10
    calm_q = statistics.median(r.queue_ms for r in calm)
    loaded_q = statistics.median(r.queue_ms for r in loaded)
    summary = (
        f"HIGH queue ms calm={calm_q:.1f} loaded={loaded_q:.1f}; HIGH TTFT ms "
        f"calm={statistics.median(r.ttft_s for r in calm) * 1000:.1f} "
        f"loaded={statistics.median(r.ttft_s for r in loaded) * 1000:.1f}; "
        f"LOW served={len(served_low)} shed={len(shed)}"
    )
    # Scheduled within a few steps, as when calm; a HIGH request that had to wait for a LOW one
    # to finish (24 tokens) would wait 12 steps on average.
    assert loaded_q <= 4 * step_ms, summary
    journal = regions.router.service.journal
    assert journal.empty_by_reason[("saturated", "low")] >= len(shed)
    assert journal.empty_by_reason[("saturated", "high")] == 0


async def test_repeated_long_prompts_land_on_the_same_worker_while_it_is_not_overloaded(
    redis_url: str,
) -> None:
    regions = await start_regions(
        [RegionSpec("kr", 1.0, workers=3)], config=sim(max_num_seqs=16, **SLOW_STEPS)
    )
    edge = await start_edge(redis_url=redis_url, router_address=regions.router.address)
    client = openai.AsyncOpenAI(
        base_url=f"{edge.url}/v1", api_key=await edge.new_key("acme"), max_retries=0
    )
    system = "You are the support assistant of Meridian. " * 100  # ~4,300 chars, 16 blocks

    async def ask(question: str) -> tuple[str, int]:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            max_tokens=2,
        )
        body = raw.parse()
        assert body.usage is not None
        assert body.usage.prompt_tokens_details is not None
        return raw.headers["x-meridian-worker"], body.usage.prompt_tokens_details.cached_tokens or 0

    try:
        first, _ = await ask("question 0")
        repeats = [await ask(f"question {i}") for i in range(1, 5)]
        assert {w for w, _ in repeats} == {first}
        assert all(cached > 0 for _, cached in repeats), repeats  # the prefix cache was hit

        full = await Hold.start(regions.workers[first].address, 16, tag="busy")
        try:
            await until_running(regions, first, 16)
            elsewhere, _ = await ask("question while busy")
            assert elsewhere != first
        finally:
            await full.release()
    finally:
        await client.close()
        await edge.stop()
        await regions.stop()


async def test_a_fleet_ejected_for_failures_is_refused_with_the_wait_until_the_first_returns(
    caller_for: Any,
) -> None:
    regions = await start_regions([RegionSpec("kr", 1.0)], config=sim())
    caller = await caller_for(regions)
    for _ in range(3):  # the default profile's failure-ejection: max_failures 3
        resp = await caller.route(follow_up=True)
        assert isinstance(resp, router_pb2.RouteResponse), resp
        await caller.report(resp, router_pb2.OUTCOME_FAILED)

    got = await caller.route()
    assert isinstance(got, Refused), got
    assert got.code is grpc.StatusCode.UNAVAILABLE, got
    assert "ejected: 3 recent failures" in got.details
    # Back once the first failure leaves the fleet's 30 s window, not "retry in a second".
    assert got.retry_after_ms is not None
    assert 25_000 <= got.retry_after_ms <= 30_000, got


async def test_failed_outcomes_count_only_for_decisions_this_router_made(caller_for: Any) -> None:
    """An outcome naming a decision nobody made, or the same failure twice, ejects no one."""
    regions = await start_regions([RegionSpec("kr", 1.0)], config=sim())
    caller = await caller_for(regions)
    resp = await caller.route(follow_up=True)
    assert isinstance(resp, router_pb2.RouteResponse), resp
    worker = resp.candidates[0].worker_id
    fakes = [
        router_pb2.OutcomeReport(
            decision_id=f"made-up-{i}", worker_id=worker, outcome=router_pb2.OUTCOME_FAILED
        )
        for i in range(10)
    ]
    repeated = [
        router_pb2.OutcomeReport(
            decision_id=resp.decision_id, worker_id=worker, outcome=router_pb2.OUTCOME_FAILED
        )
    ] * 5
    await caller.report_batch([*fakes, *repeated])
    assert regions.view()[worker].recent_failures == 1
    assert isinstance(await caller.route(), router_pb2.RouteResponse)
