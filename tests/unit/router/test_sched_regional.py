"""Region pre-selection (``scheduling/regional.py``): the profile decides over the chosen
regions' workers only, never refuses what the whole fleet would serve, respects residency, and
the router's service uses it; the region index stays current incrementally."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from meridian.v1 import worker_pb2
from services.common.clock import SYSTEM_CLOCK
from services.router.fleet import Fleet
from services.router.scheduling.framework import SchedulerProfile
from services.router.scheduling.profile import ProfileError, load_profile
from services.router.scheduling.regional import RegionIndex, RegionStage, RegionSummary
from services.router.scheduling.types import (
    ModelState,
    ModelStatus,
    Priority,
    RouteQuery,
    WorkerSnapshot,
)
from services.router.service import RouterService

DEFAULT = Path(__file__).resolve().parents[3] / "deploy/router/profiles/default.yaml"
READY = (ModelStatus("m", ModelState.READY),)
# region → (rtt ms, running of 4 on each of its 3 workers)
REGIONS = {"kr": (4.0, 4), "jp": (36.0, 1), "us": (140.0, 0), "eu": (250.0, 0)}


def profile(**regions: Any) -> SchedulerProfile:
    doc = yaml.safe_load(DEFAULT.read_text())
    if regions:
        doc["profiles"]["default"]["regions"] = regions
    return load_profile(doc, rng=random.Random(3))


def fleet_rows(regions: dict[str, tuple[float, int]] = REGIONS) -> list[WorkerSnapshot]:
    return [
        WorkerSnapshot(
            f"{r}-{i}", r, f"{r}{i}:1", models=READY, rtt_ms=rtt, max_running=4, running=run
        )
        for r, (rtt, run) in regions.items()
        for i in range(3)
    ]


def test_the_profile_decides_among_the_chosen_regions_and_says_which() -> None:
    rows = fleet_rows()
    whole = profile().schedule(RouteQuery("q", "m"), rows)
    staged = profile(max_regions=2).schedule_view(RouteQuery("q", "m"), RegionIndex().update(rows))
    assert staged.ranked[0].worker.region == whole.ranked[0].worker.region == "jp"
    assert "[regions: jp, us of 4]" in staged.explanation
    # the full kr region (0 free slots) is not among the chosen, though it is nearest
    assert all(s.worker.region in ("jp", "us") for s in staged.ranked)


def test_when_no_chosen_worker_survives_the_filters_the_whole_fleet_decides() -> None:
    rows = fleet_rows()
    # every jp and us worker excluded (tried already): only kr (full) and eu are left
    tried = frozenset(w.worker_id for w in rows if w.region in ("jp", "us"))
    q = RouteQuery("q", "m", exclude_worker_ids=tried)
    d = profile(max_regions=2).schedule_view(q, RegionIndex().update(rows))
    assert d.ranked
    assert d.ranked[0].worker.region == "eu"
    assert "[regions:" not in d.explanation


def test_regions_outside_the_allowed_ones_are_never_chosen() -> None:
    q = RouteQuery("q", "m", allowed_regions=frozenset({"us", "eu"}))
    d = profile(max_regions=1).schedule_view(q, RegionIndex().update(fleet_rows()))
    assert {s.worker.region for s in d.ranked} <= {"us", "eu"}


def test_a_refusal_is_classified_over_the_whole_fleet() -> None:
    q = RouteQuery("q", "unknown-model")
    d = profile(max_regions=1).schedule_view(q, RegionIndex().update(fleet_rows()))
    assert not d.ranked
    assert d.empty_reason is not None
    assert d.empty_reason.value == "unknown_model"


def test_region_index_re_summarises_only_what_changed() -> None:
    rows = fleet_rows()
    index = RegionIndex().update(rows)
    before = {s.region: s for s in index.summaries()}
    assert before["jp"].capacity == 12
    assert before["jp"].busy == 3
    assert before["jp"].free == 9
    assert before["jp"].rtt_ms == 36.0
    assert before["jp"].models == frozenset({"m"})
    changed = list(rows)
    changed[3] = WorkerSnapshot(
        "jp-0", "jp", "jp0:1", models=READY, rtt_ms=36.0, max_running=4, running=1, in_flight=2
    )
    after = {s.region: s for s in index.update(changed).summaries()}
    assert after["jp"].busy == 5
    assert after["kr"] is before["kr"]
    assert after["us"] is before["us"]
    assert index.rows(["jp"])[0] is changed[3]


def test_unhealthy_and_draining_workers_count_for_nothing() -> None:
    rows = [
        WorkerSnapshot("a", "kr", "a:1", models=READY, healthy=False, max_running=4),
        WorkerSnapshot("b", "kr", "b:1", models=READY, draining=True, max_running=4),
    ]
    (s,) = RegionIndex().update(rows).summaries()
    assert (s.workers, s.healthy, s.capacity, s.rtt_ms, s.models) == (2, 0, 0, None, frozenset())


def test_region_scores_weigh_latency_against_free_capacity() -> None:
    stage = RegionStage(max_regions=1)
    index = RegionIndex().update(fleet_rows({"near": (10.0, 3), "far": (100.0, 0)}))
    chosen, eligible = stage.select(RouteQuery("q", "m"), index.summaries(), random.Random(1))
    # near: (50/60 + 3/12) / 2 = 0.54; far: (50/150 + 1) / 2 = 0.67
    assert (chosen, eligible) == (("far",), 2)


@pytest.mark.parametrize(
    ("regions", "where"),
    [
        ({"max_regions": 0}, "profiles[default].regions.max_regions: must be >= 1"),
        ({"tau_ms": -1}, "profiles[default].regions.tau_ms: must be > 0"),
        ({"max_region": 2}, "profiles[default].regions.max_region: unknown parameter"),
        ({"max_regions": "three"}, "profiles[default].regions.max_regions:"),
    ],
)
def test_a_bad_regions_section_names_the_key(regions: dict[str, Any], where: str) -> None:
    with pytest.raises(ProfileError) as err:
        profile(**regions)
    assert where in str(err.value)


def test_the_router_service_decides_through_the_region_stage() -> None:
    fleet = Fleet()
    for r, (rtt, run) in REGIONS.items():
        for i in range(3):
            addr = f"{r}{i}:7000"
            fleet.add(addr)
            fleet.on_describe(addr, worker_pb2.WorkerInfo(worker_id=f"{r}-{i}", region=r))
            rep = worker_pb2.LoadReport(worker_id=f"{r}-{i}", region=r, running=run, max_running=4)
            rep.models.add(name="m", state=worker_pb2.MODEL_STATE_READY, max_model_len=4096)
            fleet.on_report(addr, rep, now=SYSTEM_CLOCK.monotonic())
            fleet.on_probe(addr, rtt)
    service = RouterService(fleet=fleet, scheduler=profile(max_regions=2), clock=SYSTEM_CLOCK)
    decision, _ = service.dry_run(RouteQuery("q", "m", priority=Priority.HIGH))
    assert decision.ranked[0].worker.region == "jp"
    assert "[regions: jp, us of 4]" in decision.explanation


def test_a_fleet_below_min_workers_is_decided_whole() -> None:
    rows = fleet_rows()  # 12 workers
    d = profile(max_regions=1, min_workers=13).schedule_view(
        RouteQuery("q", "m"), RegionIndex().update(rows)
    )
    assert "[regions:" not in d.explanation
    assert "of 9 candidates" in d.explanation  # every region's workers were candidates
    d = profile(max_regions=1, min_workers=12).schedule_view(
        RouteQuery("q", "m"), RegionIndex().update(rows)
    )
    assert "[regions: jp of 4]" in d.explanation


def test_an_unexplained_decision_ranks_exactly_as_an_explained_one() -> None:
    """``explain=False`` (the simulator's unsampled decisions) skips contributions and the
    winner line only: same workers, same order, same scores, same random draws, decision
    after decision, with and without the region stage."""
    rng = random.Random(11)
    regions = {f"r{i}": (rng.uniform(2.0, 200.0), rng.randrange(5)) for i in range(8)}
    rows = fleet_rows(regions)
    for stage in ({}, {"max_regions": 1}, {"max_regions": 3}):
        explained, bare = profile(**stage), profile(**stage)
        index_a, index_b = RegionIndex(), RegionIndex()
        for n in range(40):
            w = rng.randrange(len(rows))
            row = rows[w]
            rows[w] = WorkerSnapshot(
                row.worker_id, row.region, row.address, models=READY, rtt_ms=row.rtt_ms,
                max_running=4, running=rng.randrange(5),
            )  # fmt: skip
            query = RouteQuery(f"q{n}", "m", session_id=f"s{n % 5}")
            a = explained.schedule_view(query, index_a.update(rows))
            b = bare.schedule_view(query, index_b.update(rows), explain=False)
            assert [(s.worker.worker_id, s.score) for s in a.ranked] == [
                (s.worker.worker_id, s.score) for s in b.ranked
            ]
            assert a.explanation
            assert a.ranked[0].contributions
            assert b.explanation == ""
            assert b.ranked[0].contributions == ()


def test_the_region_stage_chooses_as_a_fresh_one_would_while_summaries_change() -> None:
    """``select`` keeps per-position keys across decisions and recomputes only the summaries
    that are new objects: its choice must be what a stage seeing the list for the first time
    picks, with the same random draws, whatever changed in between."""
    rng = random.Random(7)
    models: tuple[frozenset[str], ...] = (frozenset({"m"}), frozenset({"m", "n"}), frozenset())

    def summary(i: int) -> RegionSummary:
        cap = rng.choice((4, 8, 400))
        return RegionSummary(
            f"r{i}", 3, rng.randrange(2), cap, rng.randrange(cap + 1),
            rng.choice((None, 2.0, 40.0, 40.0, rng.uniform(1.0, 300.0))), rng.choice(models),
        )  # fmt: skip

    summaries = [summary(i) for i in range(30)]
    for max_regions, near_equal in ((1, 0.0), (3, 0.0), (1, 0.1), (3, 0.1)):
        kept = RegionStage(max_regions=max_regions, near_equal=near_equal)
        for n in range(300):
            for _ in range(rng.randrange(4)):
                i = rng.randrange(len(summaries))
                summaries[i] = summary(i)
            allowed = frozenset() if n % 3 else frozenset(f"r{i}" for i in range(0, 30, 2))
            query = RouteQuery(f"q{n}", rng.choice(("m", "n")), allowed_regions=allowed)
            seed = rng.random()
            got = kept.select(query, summaries, random.Random(seed))
            fresh = RegionStage(max_regions=max_regions, near_equal=near_equal).select(
                query, list(summaries), random.Random(seed)
            )
            assert got == fresh


def near_equal_summaries() -> list[RegionSummary]:
    # a: 20 free of 40, b: 15 free (a little nearer), c: as free as a but far, d: full
    return [
        RegionSummary("a", 10, 10, 40, 20, 10.0, frozenset({"m"})),
        RegionSummary("b", 10, 10, 40, 25, 8.0, frozenset({"m"})),
        RegionSummary("c", 10, 10, 40, 20, 250.0, frozenset({"m"})),
        RegionSummary("d", 10, 10, 40, 40, 2.0, frozenset({"m"})),
    ]


def test_near_equal_regions_share_a_burst_in_proportion_to_their_free_slots() -> None:
    """Replicas that rank the same stale summaries must not all send their next requests to
    the one best region: among regions within ``near_equal`` of the best, the first is drawn
    in proportion to free slots (a: 20, b: 15); a region clearly worse (c, far), or full (d,
    the nearest), is never drawn."""
    stage = RegionStage(max_regions=1, near_equal=0.1)
    summaries = near_equal_summaries()
    # scores: a (50/60 + 0.5)/2 = 0.67, b (50/58 + 0.375)/2 = 0.62, c (50/300 + 0.5)/2 = 0.33,
    # d: no free slot
    rng = random.Random(5)
    picks = [stage.select(RouteQuery(f"q{n}", "m"), summaries, rng)[0] for n in range(3000)]
    counts = {r: sum(p == (r,) for p in picks) for r in "abcd"}
    assert counts["c"] == counts["d"] == 0
    assert 1.2 < counts["a"] / counts["b"] < 1.5  # free slots 20 : 15


def chosen_over(stage: RegionStage, requests: int = 200) -> set[tuple[str, ...]]:
    """Every region choice ``stage`` made for ``requests`` queries on near_equal_summaries."""
    rng = random.Random(5)
    summaries = near_equal_summaries()
    return {stage.select(RouteQuery(f"q{n}", "m"), summaries, rng)[0] for n in range(requests)}


def test_without_near_equal_the_best_region_takes_every_request() -> None:
    assert chosen_over(RegionStage(max_regions=1)) == {("a",)}


def test_a_region_alone_within_near_equal_is_chosen_every_time() -> None:
    assert chosen_over(RegionStage(max_regions=1, near_equal=0.03)) == {("a",)}


def test_with_several_regions_the_drawn_one_comes_first_and_the_rest_follow_by_rank() -> None:
    stage = RegionStage(max_regions=2, near_equal=0.1)
    rng = random.Random(5)
    seen = set()
    for n in range(300):
        chosen, eligible = stage.select(RouteQuery(f"q{n}", "m"), near_equal_summaries(), rng)
        assert eligible == 4
        seen.add(chosen)
    assert seen == {("a", "b"), ("b", "a")}  # d (full) never; c only behind both


def test_when_no_region_has_free_slots_near_equal_changes_nothing() -> None:
    full = [s._replace(busy=s.capacity) for s in near_equal_summaries()]
    seed = 11
    with_draw = RegionStage(max_regions=1, near_equal=0.2).select(
        RouteQuery("q", "m"), full, random.Random(seed)
    )
    without = RegionStage(max_regions=1).select(RouteQuery("q", "m"), full, random.Random(seed))
    assert with_draw == without


def test_a_bad_region_near_equal_names_the_key() -> None:
    with pytest.raises(ProfileError) as err:
        profile(max_regions=1, near_equal=1.5)
    assert "profiles[default].regions.near_equal: must be between 0 and 1" in str(err.value)
