"""The framework's own rules: clamping, weighting, tie-breaking, explanations, timings, the
plugin contract. Uses a hand-written recording plugin (a real implementation of the plugin
interfaces), never mocks."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import ClassVar, Self

import pytest

from services.router.scheduling.filters.exclude import ExcludeFilter
from services.router.scheduling.framework import SchedulerProfile, WeightedScorer, clamp
from services.router.scheduling.params import Params
from services.router.scheduling.pickers.max_score import MaxScorePicker
from services.router.scheduling.plugin import (
    Candidates,
    Picker,
    PluginContext,
    PostPick,
    Scored,
    Scorer,
    WorkerFilter,
)
from services.router.scheduling.scorers.kv_cache import KvCacheScorer
from services.router.scheduling.scorers.latency import LatencyScorer
from services.router.scheduling.scorers.queue import QueueScorer
from services.router.scheduling.types import (
    Decision,
    ModelState,
    ModelStatus,
    RouteQuery,
    WorkerSnapshot,
)
from tests.support.builders import profile, q, w


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


# --- clamping and weighting -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "clamped"),
    [(0.5, 0.5), (1.7, 1.0), (-0.3, 0.0), (math.nan, 0.0), (math.inf, 1.0), (-math.inf, 0.0)],
)
def test_framework_clamps_every_score_to_the_unit_interval(raw: float, clamped: float) -> None:
    assert clamp(raw) == clamped
    rec = RecordingScorer({"a": raw})
    decision = profile(WeightedScorer(rec, 1.0)).schedule(q(), [w("a")])
    (only,) = decision.ranked
    assert only.contributions[0].score == clamped
    assert only.score == clamped


def test_memoised_scores_are_clamped_too() -> None:
    # loss 10 % with max 5 %: raw score -1.0, clamped to 0; queue over capacity: also 0.
    s = profile(WeightedScorer(QueueScorer(), 1.0))
    (only,) = s.schedule(q(), [w("a", running=30, max_running=10)]).ranked
    assert only.score == 0.0
    assert only.contributions[0].score == 0.0


def test_weights_are_applied_by_the_framework_as_shares_of_the_total() -> None:
    latency = WeightedScorer(LatencyScorer(tau_ms=50), 3.0)
    rec = WeightedScorer(RecordingScorer({"a": 1.0, "b": 0.0}), 1.0)
    decision = profile(latency, rec).schedule(q(), [w("a", rtt_ms=50.0), w("b", rtt_ms=0.0)])
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
        profile(WeightedScorer(LatencyScorer(), 1), WeightedScorer(LatencyScorer(), 2))


def test_contributions_follow_profile_order_whatever_the_plugin_kind() -> None:
    s = profile(
        WeightedScorer(LatencyScorer(), 1),
        WeightedScorer(RecordingScorer({"a": 0.5}), 1),
        WeightedScorer(KvCacheScorer(), 1),
    )
    (only,) = s.schedule(q(), [w("a", rtt_ms=1.0)]).ranked
    assert [c.signal for c in only.contributions] == ["latency", "recording", "kv-cache"]
    assert [c.detail for c in only.contributions] == ["rtt=1.0ms", "recorded=0.5", "kv=0.00"]


# --- picking ----------------------------------------------------------------------------------


def test_ranked_list_is_primary_then_fallbacks_best_first() -> None:
    s = profile(WeightedScorer(LatencyScorer(), 1), k=3)
    rows = [
        w("far", rtt_ms=90.0),
        w("near", rtt_ms=2.0),
        w("mid", rtt_ms=30.0),
        w("x", rtt_ms=200.0),
    ]
    assert [r.worker.worker_id for r in s.schedule(q(), rows).ranked] == ["near", "mid", "far"]


def test_equal_workers_share_the_next_burst() -> None:
    s = profile(WeightedScorer(LatencyScorer(), 1), k=1, seed=42)
    rows = [w(f"w{i}", rtt_ms=10.0) for i in range(4)]
    primaries = Counter(s.schedule(q(), rows).ranked[0].worker.worker_id for _ in range(2000))
    assert set(primaries) == {"w0", "w1", "w2", "w3"}
    assert all(400 < n < 600 for n in primaries.values()), primaries


def test_ties_spread_across_many_equal_workers_too() -> None:
    """Beyond 32 candidates the framework ranks a shortlist; a crowd tied at the top must
    still share the burst (the shortlist gives way to a full scan)."""
    s = profile(WeightedScorer(LatencyScorer(), 1), k=1, seed=3)
    rows = [w(f"w{i}", rtt_ms=10.0) for i in range(100)] + [w("slow", rtt_ms=90.0)]
    primaries = Counter(s.schedule(q(), rows).ranked[0].worker.worker_id for _ in range(3000))
    assert "slow" not in primaries
    assert len(primaries) == 100
    assert max(primaries.values()) < 70, primaries.most_common(3)


def test_seeded_rng_makes_tie_breaks_reproducible() -> None:
    rows = [w(f"w{i}") for i in range(5)]

    def picks(seed: int) -> list[str]:
        s = profile(WeightedScorer(KvCacheScorer(), 1), k=1, seed=seed)
        return [s.schedule(q(), rows).ranked[0].worker.worker_id for _ in range(20)]

    assert picks(9) == picks(9)
    assert picks(9) != picks(10)


# --- explanations -----------------------------------------------------------------------------


def test_explanation_names_the_signals_that_decided_against_the_runner_up() -> None:
    s = profile(WeightedScorer(LatencyScorer(), 3), WeightedScorer(QueueScorer(), 3))
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
    s = profile(WeightedScorer(LatencyScorer(), 1), WeightedScorer(KvCacheScorer(), 1))
    decision = s.schedule(q(), [w("a", rtt_ms=50.0, kv_cache_usage=0.2), w("b", healthy=False)])
    line = decision.explanation
    assert line.startswith("a (eu) 0.650 was the only candidate left: ")
    assert "kv-cache 0.400 (kv=0.20), latency 0.250 (rtt=50.0ms)" in line
    assert line.endswith("[1 ranked of 1 candidates, 1 filtered]")


def test_explanation_of_a_tie() -> None:
    s = profile(WeightedScorer(KvCacheScorer(), 1))
    assert "tied with" in s.schedule(q(), [w("a"), w("b")]).explanation


def test_rejections_say_which_filter_removed_whom_and_why() -> None:
    s = profile(WeightedScorer(KvCacheScorer(), 1), filters=[ExcludeFilter()])
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
    s = profile(WeightedScorer(KvCacheScorer(), 1))
    decision = s.schedule(
        q(allowed_regions=frozenset({"eu"})), [w("x", region="us", healthy=False), w("y")]
    )
    assert [(r.worker_id, r.filter) for r in decision.rejected] == [("x", "residency")]


# --- timings and hooks ----------------------------------------------------------------------


def test_every_plugin_call_is_timed_in_microseconds() -> None:
    rec = RecordingScorer({"a": 1.0})
    s = profile(
        WeightedScorer(LatencyScorer(), 1), WeightedScorer(rec, 1), filters=[ExcludeFilter()]
    )
    timings = s.schedule(q(), [w("a"), w("b")]).plugin_timings_us
    plugins = {
        "residency",
        "model-ready",
        "capability",
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
    s = profile(WeightedScorer(rec, 1))
    first = s.schedule(q(), [w("a")])
    s.schedule(q(model="nope"), [w("a")])
    assert rec.observed == [first]


def test_plain_scorers_see_only_the_candidates_and_may_name_others() -> None:
    rec = RecordingScorer({"a": 1.0, "ghost": 1.0})
    s = profile(WeightedScorer(rec, 1), filters=[ExcludeFilter()])
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


class ShortFilter(WorkerFilter[None]):
    """A broken filter: answers for one worker less than it was given."""

    TYPE: ClassVar[str] = "short"

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls()

    def key(self, query: RouteQuery) -> None:
        return None

    def reject(self, workers: Sequence[WorkerSnapshot], key: None) -> list[str | None]:
        return [None] * (len(workers) - 1)


def test_plugins_that_break_the_contract_fail_loudly() -> None:
    s = SchedulerProfile(filters=[], scorers=[], picker=RepeatingPicker())
    with pytest.raises(RuntimeError, match="picker 'repeating' returned invalid indices"):
        s.schedule(q(), [w("a"), w("b")])
    s = SchedulerProfile(filters=[ShortFilter()], scorers=[], picker=MaxScorePicker())
    with pytest.raises(RuntimeError, match="plugin 'short' answered 1 times for 2 workers"):
        s.schedule(q(), [w("a"), w("b")])
