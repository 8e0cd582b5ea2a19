"""The framework's own rules: clamping, weighting, tie-breaking, explanations, empty-decision
classification, timings, incremental evaluation. Uses hand-written recording plugins (real
implementations of the plugin interfaces), never mocks."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

import pytest
import yaml

from services.common.clock import ManualClock
from services.router.scheduling.filters.admission import AdmissionFilter
from services.router.scheduling.filters.exclude import ExcludeFilter
from services.router.scheduling.filters.healthy import HealthyFilter
from services.router.scheduling.filters.model import ModelReadyFilter
from services.router.scheduling.filters.residency import ResidencyFilter
from services.router.scheduling.framework import Scheduler, WeightedScorer, clamp
from services.router.scheduling.params import Params
from services.router.scheduling.pickers.max_score import MaxScorePicker
from services.router.scheduling.plugin import (
    Candidates,
    Filter,
    Picker,
    PluginContext,
    PostPick,
    Scored,
    Scorer,
    WorkerFilter,
)
from services.router.scheduling.profile import load_profile
from services.router.scheduling.scorers.kv_cache import KvCacheScorer
from services.router.scheduling.scorers.latency import LatencyScorer
from services.router.scheduling.scorers.queue import QueueScorer
from services.router.scheduling.types import (
    Decision,
    ModelState,
    ModelStatus,
    NoCandidate,
    Priority,
    RouteQuery,
    WorkerSnapshot,
)

READY = (ModelStatus("m", ModelState.READY),)
DEFAULT_PROFILE = Path(__file__).resolve().parents[3] / "deploy/router/profiles/default.yaml"


def w(worker_id: str, **kw: Any) -> WorkerSnapshot:
    fields: dict[str, Any] = {"region": "eu", "address": f"{worker_id}:1", "models": READY}
    fields.update(kw)
    return WorkerSnapshot(worker_id=worker_id, **fields)


def q(**kw: Any) -> RouteQuery:
    return RouteQuery(request_id="r", **{"model": "m", **kw})


class RecordingScorer(Scorer, PostPick):
    """Returns the scores it is told to, and records what it was asked and shown."""

    TYPE: ClassVar[str] = "recording"

    def __init__(self, scores: Mapping[str, float] | None = None) -> None:
        self.scores = dict(scores or {})
        self.calls: list[list[str]] = []
        self.observed: list[Decision] = []

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls()

    def score(self, query: RouteQuery, candidates: Candidates) -> Mapping[str, float]:
        self.calls.append([c.worker_id for c in candidates])
        return dict(self.scores)

    def detail(self, query: RouteQuery, worker: WorkerSnapshot) -> str:
        return f"recorded={self.scores.get(worker.worker_id, 0.0)}"

    def observe(self, query: RouteQuery, decision: Decision) -> None:
        self.observed.append(decision)


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


def scheduler(
    *scorers: WeightedScorer, filters: Sequence[Filter] = (), k: int = 3, seed: int = 1
) -> Scheduler:
    base: list[Filter] = [ResidencyFilter(), ModelReadyFilter(), HealthyFilter()]
    return Scheduler(
        filters=[*base, *filters],
        scorers=scorers,
        picker=MaxScorePicker(max_candidates=k),
        rng=random.Random(seed),
    )


# --- clamping and weighting -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "clamped"),
    [(0.5, 0.5), (1.7, 1.0), (-0.3, 0.0), (math.nan, 0.0), (math.inf, 1.0), (-math.inf, 0.0)],
)
def test_framework_clamps_every_score_to_the_unit_interval(raw: float, clamped: float) -> None:
    assert clamp(raw) == clamped
    rec = RecordingScorer({"a": raw})
    decision = scheduler(WeightedScorer(rec, 1.0)).schedule(q(), [w("a")])
    (only,) = decision.ranked
    assert only.contributions[0].score == clamped
    assert only.score == clamped


def test_memoised_scores_are_clamped_too() -> None:
    # loss 10 % with max 5 %: raw score -1.0, clamped to 0; queue over capacity: also 0.
    s = scheduler(WeightedScorer(QueueScorer(), 1.0))
    (only,) = s.schedule(q(), [w("a", running=30, max_running=10)]).ranked
    assert only.score == 0.0
    assert only.contributions[0].score == 0.0


def test_weights_are_applied_by_the_framework_as_shares_of_the_total() -> None:
    latency = WeightedScorer(LatencyScorer(tau_ms=50), 3.0)
    rec = WeightedScorer(RecordingScorer({"a": 1.0, "b": 0.0}), 1.0)
    decision = scheduler(latency, rec).schedule(q(), [w("a", rtt_ms=50.0), w("b", rtt_ms=0.0)])
    by_id = {s.worker.worker_id: s for s in decision.ranked}
    # a: (3 * 0.5 + 1 * 1.0) / 4 = 0.625; b: (3 * 1.0 + 1 * 0.0) / 4 = 0.75
    assert by_id["a"].score == pytest.approx(0.625)
    assert by_id["b"].score == pytest.approx(0.75)
    assert [c.signal for c in by_id["a"].contributions] == ["latency", "recording"]
    assert [(c.score, c.weight) for c in by_id["a"].contributions] == [(0.5, 3.0), (1.0, 1.0)]
    assert [c.weighted for c in by_id["a"].contributions] == pytest.approx([0.375, 0.25])
    assert sum(c.weighted for c in by_id["b"].contributions) == pytest.approx(by_id["b"].score)
    assert [s.worker.worker_id for s in decision.ranked] == ["b", "a"]


@pytest.mark.parametrize("weight", [0.0, -1.0, math.nan, math.inf])
def test_a_scorer_without_a_positive_weight_is_a_config_error(weight: float) -> None:
    with pytest.raises(ValueError, match="weight must be > 0"):
        WeightedScorer(LatencyScorer(), weight)


def test_a_plugin_may_appear_once_per_profile() -> None:
    with pytest.raises(ValueError, match="'latency' appears twice"):
        scheduler(WeightedScorer(LatencyScorer(), 1), WeightedScorer(LatencyScorer(), 2))


def test_contributions_follow_profile_order_whatever_the_plugin_kind() -> None:
    s = scheduler(
        WeightedScorer(LatencyScorer(), 1),
        WeightedScorer(RecordingScorer({"a": 0.5}), 1),
        WeightedScorer(KvCacheScorer(), 1),
    )
    (only,) = s.schedule(q(), [w("a", rtt_ms=1.0)]).ranked
    assert [c.signal for c in only.contributions] == ["latency", "recording", "kv-cache"]
    assert [c.detail for c in only.contributions] == ["rtt=1.0ms", "recorded=0.5", "kv=0.00"]


# --- picking ----------------------------------------------------------------------------------


def test_ranked_list_is_primary_then_fallbacks_best_first() -> None:
    s = scheduler(WeightedScorer(LatencyScorer(), 1), k=3)
    rows = [
        w("far", rtt_ms=90.0),
        w("near", rtt_ms=2.0),
        w("mid", rtt_ms=30.0),
        w("x", rtt_ms=200.0),
    ]
    assert [r.worker.worker_id for r in s.schedule(q(), rows).ranked] == ["near", "mid", "far"]


def test_equal_workers_share_the_next_burst() -> None:
    s = scheduler(WeightedScorer(LatencyScorer(), 1), k=1, seed=42)
    rows = [w(f"w{i}", rtt_ms=10.0) for i in range(4)]
    primaries = Counter(s.schedule(q(), rows).ranked[0].worker.worker_id for _ in range(2000))
    assert set(primaries) == {"w0", "w1", "w2", "w3"}
    assert all(400 < n < 600 for n in primaries.values()), primaries


def test_ties_spread_across_many_equal_workers_too() -> None:
    """Beyond 32 candidates the framework ranks a shortlist; a crowd tied at the top must
    still share the burst (the shortlist gives way to a full scan)."""
    s = scheduler(WeightedScorer(LatencyScorer(), 1), k=1, seed=3)
    rows = [w(f"w{i}", rtt_ms=10.0) for i in range(100)] + [w("slow", rtt_ms=90.0)]
    primaries = Counter(s.schedule(q(), rows).ranked[0].worker.worker_id for _ in range(3000))
    assert "slow" not in primaries
    assert len(primaries) == 100
    assert max(primaries.values()) < 70, primaries.most_common(3)


def test_seeded_rng_makes_tie_breaks_reproducible() -> None:
    rows = [w(f"w{i}") for i in range(5)]

    def picks(seed: int) -> list[str]:
        s = scheduler(WeightedScorer(KvCacheScorer(), 1), k=1, seed=seed)
        return [s.schedule(q(), rows).ranked[0].worker.worker_id for _ in range(20)]

    assert picks(9) == picks(9)
    assert picks(9) != picks(10)


# --- explanations -----------------------------------------------------------------------------


def test_explanation_names_the_signals_that_decided_against_the_runner_up() -> None:
    s = scheduler(WeightedScorer(LatencyScorer(), 3), WeightedScorer(QueueScorer(), 3))
    rows = [
        w("near", region="seoul", rtt_ms=2.0, running=19, max_running=20),
        w("far", region="tokyo", rtt_ms=60.0, running=2, max_running=20),
    ]
    decision = s.schedule(q(), rows)
    assert decision.ranked[0].worker.worker_id == "far"
    line = decision.explanation
    assert line.startswith("far (tokyo) 0.")
    assert " beat near (seoul) 0." in line
    assert "queue +0.425 (slots=2+0+0/20 vs slots=19+0+0/20)" in line
    assert "despite latency -0.253 (rtt=60.0ms vs rtt=2.0ms)" in line
    assert line.endswith("[2 ranked of 2 candidates, 0 filtered]")


def test_explanation_for_a_single_candidate_lists_its_contributions() -> None:
    s = scheduler(WeightedScorer(LatencyScorer(), 1), WeightedScorer(KvCacheScorer(), 1))
    decision = s.schedule(q(), [w("a", rtt_ms=50.0, kv_cache_usage=0.2), w("b", healthy=False)])
    line = decision.explanation
    assert line.startswith("a (eu) 0.650 was the only candidate left: ")
    assert "kv-cache 0.400 (kv=0.20), latency 0.250 (rtt=50.0ms)" in line
    assert line.endswith("[1 ranked of 1 candidates, 1 filtered]")


def test_explanation_of_a_tie() -> None:
    s = scheduler(WeightedScorer(KvCacheScorer(), 1))
    assert "tied with" in s.schedule(q(), [w("a"), w("b")]).explanation


def test_rejections_say_which_filter_removed_whom_and_why() -> None:
    s = scheduler(WeightedScorer(KvCacheScorer(), 1), filters=[ExcludeFilter()])
    rows = [
        w("ok"),
        w("sick", healthy=False, health_detail="stream closed"),
        w("us", region="us"),
        w("tried"),
        w("loading", models=(ModelStatus("m", ModelState.LOADING),)),
    ]
    decision = s.schedule(
        q(allowed_regions=frozenset({"eu"}), exclude_worker_ids=frozenset({"tried"})), rows
    )
    assert [r.worker.worker_id for r in decision.ranked] == ["ok"]
    assert {(r.worker_id, r.filter, r.reason) for r in decision.rejected} == {
        ("sick", "healthy", "unhealthy: stream closed"),
        ("us", "residency", "region 'us' not in (eu)"),
        ("tried", "exclude", "already tried for this request"),
        ("loading", "model-ready", "model 'm' is loading"),
    }


def test_a_worker_rejected_by_several_filters_is_reported_once_by_the_first() -> None:
    s = scheduler(WeightedScorer(KvCacheScorer(), 1))
    decision = s.schedule(
        q(allowed_regions=frozenset({"eu"})), [w("x", region="us", healthy=False), w("y")]
    )
    assert [(r.worker_id, r.filter) for r in decision.rejected] == [("x", "residency")]


# --- empty decisions ------------------------------------------------------------------------


def full(worker_id: str, **kw: Any) -> WorkerSnapshot:
    return w(worker_id, **{"running": 99, "max_running": 100, **kw})


EMPTY_CASES: list[tuple[str, RouteQuery, list[WorkerSnapshot], NoCandidate, float | None]] = [
    ("no worker lists it", q(model="nope"), [w("a"), w("b")], NoCandidate.UNKNOWN_MODEL, None),
    (
        "only outside allowed regions",
        q(allowed_regions=frozenset({"eu"})),
        [w("a", region="us"), w("b", region="ap"), w("c", region="eu", models=())],
        NoCandidate.REGION_NOT_ALLOWED,
        None,
    ),
    (
        "every allowed worker saturated",
        q(priority=Priority.LOW),
        [full("a"), full("b")],
        NoCandidate.SATURATED,
        2.5,
    ),
    (
        "saturated or down",
        q(),
        [full("a", running=100), w("b", healthy=False)],
        NoCandidate.SATURATED,
        2.5,
    ),
    ("nothing healthy", q(), [w("a", healthy=False)], NoCandidate.UNAVAILABLE, 1.0),
    (
        "model still loading",
        q(),
        [w("a", models=(ModelStatus("m", ModelState.LOADING),))],
        NoCandidate.UNAVAILABLE,
        1.0,
    ),
    (
        "all tried already",
        q(exclude_worker_ids=frozenset({"a"})),
        [w("a")],
        NoCandidate.UNAVAILABLE,
        1.0,
    ),
    ("no workers at all", q(), [], NoCandidate.UNAVAILABLE, 1.0),
    (
        "no worker has reported its models yet",
        q(),
        [w("a", models=(), healthy=False, health_detail="not connected yet")],
        NoCandidate.UNAVAILABLE,
        1.0,
    ),
]


@pytest.mark.parametrize(
    ("case", "query", "rows", "reason", "retry"), EMPTY_CASES, ids=[c[0] for c in EMPTY_CASES]
)
def test_empty_decisions_are_classified(
    case: str,
    query: RouteQuery,
    rows: list[WorkerSnapshot],
    reason: NoCandidate,
    retry: float | None,
) -> None:
    s = scheduler(
        WeightedScorer(KvCacheScorer(), 1),
        filters=[AdmissionFilter(retry_after_s=2.5), ExcludeFilter()],
    )
    decision = s.schedule(query, rows)
    assert decision.ranked == ()
    assert decision.empty_reason is reason
    assert decision.retry_after_s == retry
    assert decision.explanation.startswith(
        f"no candidate for model '{query.model}' ({reason.value})"
    )


def test_empty_explanation_counts_rejections_per_filter_with_an_example() -> None:
    s = scheduler(WeightedScorer(KvCacheScorer(), 1), filters=[AdmissionFilter()])
    decision = s.schedule(
        q(priority=Priority.LOW), [full("a"), full("b"), w("c", healthy=False, health_detail="x")]
    )
    assert decision.explanation == (
        "no candidate for model 'm' (saturated): "
        "admission removed 2 (e.g. a: refuses LOW at load 0.99 >= 0.95 "
        "(slots=99+0+0/100 kv=0.00)); "
        "healthy removed 1 (e.g. c: unhealthy: x)"
    )


def test_repeated_empty_decisions_follow_worker_changes() -> None:
    s = scheduler(WeightedScorer(KvCacheScorer(), 1), filters=[AdmissionFilter()])
    rows = [full("a"), full("b")]
    low = q(priority=Priority.LOW)
    assert s.schedule(low, rows).empty_reason is NoCandidate.SATURATED
    assert s.schedule(low, rows).empty_reason is NoCandidate.SATURATED
    rows = [w("a", healthy=False), w("b", healthy=False)]
    assert s.schedule(low, rows).empty_reason is NoCandidate.UNAVAILABLE
    assert s.schedule(low, rows).empty_reason is NoCandidate.UNAVAILABLE
    rows[1] = w("b", running=10, max_running=100)
    assert [r.worker.worker_id for r in s.schedule(low, rows).ranked] == ["b"]


# --- timings and hooks ----------------------------------------------------------------------


def test_every_plugin_call_is_timed_in_microseconds() -> None:
    rec = RecordingScorer({"a": 1.0})
    s = scheduler(
        WeightedScorer(LatencyScorer(), 1), WeightedScorer(rec, 1), filters=[ExcludeFilter()]
    )
    timings = s.schedule(q(), [w("a"), w("b")]).plugin_timings_us
    plugins = {
        "residency",
        "model-ready",
        "healthy",
        "exclude",
        "latency",
        "recording",
        "max-score",
    }
    assert set(timings) == plugins | {"explain", "framework", "total"}
    assert all(v >= 0 for v in timings.values())
    assert timings["total"] == pytest.approx(sum(v for k, v in timings.items() if k != "total"))
    assert timings["latency"] > 0  # computed on this first decision
    empty = s.schedule(q(model="nope"), [w("a")]).plugin_timings_us
    assert empty["total"] > 0
    assert "max-score" in empty


def test_post_pick_hooks_observe_each_non_empty_decision() -> None:
    rec = RecordingScorer()
    s = scheduler(WeightedScorer(rec, 1))
    first = s.schedule(q(), [w("a")])
    s.schedule(q(model="nope"), [w("a")])
    assert rec.observed == [first]


def test_plain_scorers_see_only_the_candidates_and_may_name_others() -> None:
    rec = RecordingScorer({"a": 1.0, "ghost": 1.0})
    s = scheduler(WeightedScorer(rec, 1), filters=[ExcludeFilter()])
    decision = s.schedule(
        q(exclude_worker_ids=frozenset({"c"})), [w("a"), w("b", healthy=False), w("c")]
    )
    assert rec.calls == [["a"]]
    assert [r.worker.worker_id for r in decision.ranked] == ["a"]


class RepeatingPicker(Picker):
    """A broken picker: names the first candidate twice."""

    TYPE: ClassVar[str] = "repeating"

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls()

    def pick(self, query: RouteQuery, scored: Scored) -> tuple[int, ...]:
        return (0, 0)


class ShortFilter(RecordingFilter):
    """A broken filter: answers for one worker less than it was given."""

    TYPE: ClassVar[str] = "short"

    def reject(self, workers: Sequence[WorkerSnapshot], key: str) -> list[str | None]:
        return [None] * (len(workers) - 1)


def test_plugins_that_break_the_contract_fail_loudly() -> None:
    s = Scheduler(filters=[], scorers=[], picker=RepeatingPicker())
    with pytest.raises(RuntimeError, match="picker 'repeating' returned invalid indices"):
        s.schedule(q(), [w("a"), w("b")])
    s = Scheduler(filters=[ShortFilter()], scorers=[], picker=MaxScorePicker())
    with pytest.raises(RuntimeError, match="plugin 'short' answered 1 times for 2 workers"):
        s.schedule(q(), [w("a"), w("b")])


# --- incremental evaluation -----------------------------------------------------------------


def test_only_changed_snapshots_are_evaluated_again() -> None:
    f = RecordingFilter()
    s = scheduler(WeightedScorer(LatencyScorer(), 1), filters=[f])
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
    s = scheduler(WeightedScorer(LatencyScorer(), 1), filters=[f])
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
