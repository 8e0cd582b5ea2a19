"""Incremental evaluation: only snapshots that changed since the last decision of a query
class are evaluated again, and a long-lived scheduler decides exactly as a fresh one."""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Self

import pytest
import yaml

from services.common.clock import ManualClock
from services.router.scheduling.filters.healthy import HealthyFilter
from services.router.scheduling.framework import WeightedScorer
from services.router.scheduling.incremental import Incremental
from services.router.scheduling.params import Params
from services.router.scheduling.plugin import (
    PluginContext,
    WorkerFilter,
)
from services.router.scheduling.profile import load_profile
from services.router.scheduling.scorers.latency import LatencyScorer
from services.router.scheduling.types import (
    Decision,
    ModelState,
    ModelStatus,
    Priority,
    RouteQuery,
    WorkerSnapshot,
)
from tests.support.builders import profile as built_profile
from tests.support.builders import q, w

DEFAULT_PROFILE = Path(__file__).resolve().parents[3] / "deploy/router/profiles/default.yaml"


class RecordingFilter(WorkerFilter[str]):
    """Rejects the ids it is told to, and records every batch it is asked to judge."""

    TYPE: ClassVar[str] = "recording-filter"

    def __init__(self, reject: Sequence[str] = ()) -> None:
        self.reject_ids = set(reject)
        self.batches: list[list[str]] = []

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls()

    def key(self, query: RouteQuery) -> str:
        return query.model

    def reject(self, workers: Sequence[WorkerSnapshot], key: str) -> list[str | None]:
        self.batches.append([x.worker_id for x in workers])
        return ["listed" if x.worker_id in self.reject_ids else None for x in workers]


# --- incremental evaluation -----------------------------------------------------------------


def test_only_changed_snapshots_are_evaluated_again() -> None:
    f = RecordingFilter()
    s = built_profile(WeightedScorer(LatencyScorer(), 1), filters=[f])
    rows = [w(f"w{i}", rtt_ms=float(i)) for i in range(5)]
    s.schedule(q(), rows)
    assert f.batches == [["w0", "w1", "w2", "w3", "w4"]]
    rows[3] = dataclasses.replace(rows[3], rtt_ms=0.5)  # a probe: a new snapshot object
    decision = s.schedule(q(), rows)
    assert f.batches[1:] == [["w3"]]
    assert decision.ranked[0].worker.worker_id == "w0"
    assert decision.ranked[1].worker is rows[3]
    s.schedule(q(allowed_regions=frozenset({"eu"})), rows)  # another query class: its own view
    assert f.batches[2:] == [["w0", "w1", "w2", "w3", "w4"]]


def test_a_worker_whose_verdict_flips_moves_in_and_out_of_the_candidates() -> None:
    f = RecordingFilter()
    s = built_profile(WeightedScorer(LatencyScorer(), 1), filters=[f])
    rows = [w("a", rtt_ms=5.0), w("b", rtt_ms=1.0), w("c", rtt_ms=9.0)]
    assert [r.worker.worker_id for r in s.schedule(q(), rows).ranked] == ["b", "a", "c"]
    rows[1] = dataclasses.replace(rows[1], healthy=False)
    decision = s.schedule(q(), rows)
    assert [r.worker.worker_id for r in decision.ranked] == ["a", "c"]
    assert [r.worker_id for r in decision.rejected] == ["b"]
    rows[1] = dataclasses.replace(rows[1], healthy=True)
    decision = s.schedule(q(), rows)
    assert [r.worker.worker_id for r in decision.ranked] == ["b", "a", "c"]
    assert decision.rejected == ()


def _random_worker(rng: random.Random, i: int, calm: bool) -> WorkerSnapshot:
    """A random worker; ``calm`` ones are nearly all eligible (so that well over 32 candidates
    remain and the shortlist is exercised), the others fail filters often."""
    odd = 0.02 if calm else 0.3
    return w(
        f"w{i}",
        region=rng.choice(("eu", "us", "ap")),
        models=(
            ModelStatus(
                "other" if rng.random() < odd else "m",
                rng.choice(list(ModelState)) if rng.random() < odd else ModelState.READY,
            ),
        ),
        healthy=rng.random() > odd / 3,
        rtt_ms=rng.choice((None, rng.uniform(1, 200))),
        running=rng.randint(0, 90 if calm else 110),
        waiting=rng.randint(0, 3),
        max_running=100,
        kv_cache_usage=rng.random() * (0.9 if calm else 1.0),
        tokens_per_second=rng.uniform(0, 3000),
        gpu_utilization=rng.choice((None, rng.random())),
        in_flight=rng.randint(0, 3),
        recent_failures=rng.randint(0, 1 if calm else 4),
        report_age_s=rng.uniform(0, 2 if calm else 4),
    )


@pytest.mark.parametrize(("n", "calm"), [(40, False), (150, True)])
def test_incremental_decisions_equal_decisions_from_scratch(n: int, calm: bool) -> None:
    """A scheduler that has seen earlier worker lists must decide exactly as a fresh one: same
    ranking, scores, contributions, rejections and empty-decision verdicts."""
    profile = yaml.safe_load(DEFAULT_PROFILE.read_text())
    # The memo is under test, not the picker: without near-equal draws the two schedulers'
    # random sources (used for exact ties only then) cannot tell them apart.
    profile["profiles"]["default"]["picker"]["params"]["near_equal"] = 0.0
    rng = random.Random(5)
    clock = ManualClock()
    live = load_profile(profile, clock=clock, rng=random.Random(0))
    rows = [_random_worker(rng, i, calm) for i in range(n)]
    changes = (0, 1, 1, 2, 3) if calm else (0, 1, 1, 2, 5, 30)
    for step in range(300):
        for _ in range(rng.choice(changes)):
            i = rng.randrange(len(rows))
            rows[i] = _random_worker(rng, i, calm)
        if rng.random() < 0.05:  # membership change
            extra = _random_worker(rng, len(rows), calm)
            rows = rows[:-1] if rng.random() < 0.5 else [*rows, extra]
        query = q(
            model=rng.choice(("m", "m", "m", "other", "nope")),
            priority=rng.choice(list(Priority)),
            allowed_regions=rng.choice((frozenset(), frozenset({"eu"}), frozenset({"us", "ap"}))),
            exclude_worker_ids=frozenset({f"w{rng.randrange(n)}"})
            if rng.random() < 0.2
            else frozenset(),
        )
        fresh = load_profile(profile, clock=clock, rng=random.Random(0))
        got = live.schedule(query, rows)
        want = fresh.schedule(query, rows)
        assert [(r.worker.worker_id, r.score, r.contributions) for r in got.ranked] == [
            (r.worker.worker_id, r.score, r.contributions) for r in want.ranked
        ], step
        assert sorted(got.rejected, key=lambda r: r.worker_id) == sorted(
            want.rejected, key=lambda r: r.worker_id
        ), step
        assert (got.empty_reason, got.retry_after_s) == (want.empty_reason, want.retry_after_s), (
            step
        )
        assert got.explanation.split(" [")[0] == want.explanation.split(" [")[0], step


def test_the_views_nearest_rtt_follows_every_patch_exactly() -> None:
    """The candidates' smallest RTT (the affinity scorers' distance gate) is kept across
    decisions instead of scanned per query; after any sequence of changes — a worker coming
    nearer, the nearest one moving away or losing its measurement, workers leaving and
    joining the candidates — it must equal a scan from scratch."""
    rng = random.Random(11)
    inc = Incremental(filters=[HealthyFilter()], scorers=[(LatencyScorer(), 1.0)])
    rows = [w(f"w{i}", rtt_ms=rng.uniform(1, 200)) for i in range(60)]
    for step in range(2_000):
        for _ in range(rng.choice((0, 1, 1, 2, 4))):
            i = rng.randrange(len(rows))
            rtt = rng.choice((None, rng.uniform(1, 200), rows[i].rtt_ms))
            rows[i] = dataclasses.replace(
                rows[i], rtt_ms=rtt, healthy=rng.random() > 0.05, in_flight=rng.randint(0, 3)
            )
        view = inc.view(q(), rows, collections.defaultdict(int))
        measured = [c.rtt_ms for c in view.candidates if c.rtt_ms is not None]
        assert view.nearest_rtt_ms() == min(measured, default=None), step


def test_affinity_sees_a_new_nearest_worker_when_the_old_one_moves_away() -> None:
    """Session affinity to a worker 60 ms away is gated while another sits at 5 ms; once that
    one's RTT rises to 100 ms, the same (long-lived, incremental) scheduler must let the
    session's worker win on affinity."""
    clock = ManualClock()
    sched = load_profile(DEFAULT_PROFILE, clock=clock, rng=random.Random(0))
    near, held = w("near", rtt_ms=5.0, max_running=64), w("held", rtt_ms=60.0, max_running=64)
    for session in ("s1", "s2"):  # both conversations start on "held"
        query = q(session_id=session, exclude_worker_ids=frozenset({"near"}))
        assert sched.schedule(query, [near, held]).ranked[0].worker.worker_id == "held"

    gated = sched.schedule(q(session_id="s2"), [near, held])  # s2 moves on; s1 stays on "held"
    assert _contribution(gated, "held", "session-affinity") == 0.0

    moved = dataclasses.replace(near, rtt_ms=100.0)
    ungated = sched.schedule(q(session_id="s1"), [moved, held])
    assert _contribution(ungated, "held", "session-affinity") > 0.0


def _contribution(decision: Decision, worker_id: str, plugin: str) -> float:
    (row,) = [r for r in decision.ranked if r.worker.worker_id == worker_id]
    return sum(c.weighted for c in row.contributions if c.signal == plugin)
