"""Pickers and the top-k they share: exact ranking, random tie-breaking, baselines."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from services.router.scheduling.pickers.max_score import MaxScorePicker
from services.router.scheduling.pickers.power_of_two import PowerOfTwoPicker
from services.router.scheduling.pickers.round_robin import RoundRobinPicker
from services.router.scheduling.pickers.weighted_random import WeightedRandomPicker
from services.router.scheduling.plugin import Candidates, Scored
from services.router.scheduling.ranking import top_k
from services.router.scheduling.types import RouteQuery, WorkerSnapshot

QUERY = RouteQuery(request_id="r", model="m")


def scored(totals: list[float], seed: int = 0) -> Scored:
    rows = [WorkerSnapshot(worker_id=f"w{i}", region="eu", address="a") for i in range(len(totals))]
    return Scored(Candidates(rows), totals, random.Random(seed))


@pytest.mark.parametrize(
    ("totals", "k", "expected"),
    [
        ([0.1, 0.9, 0.5], 1, [1]),
        ([0.1, 0.9, 0.5], 2, [1, 2]),
        ([0.1, 0.9, 0.5], 3, [1, 2, 0]),
        ([0.1, 0.9, 0.5], 5, [1, 2, 0]),
        ([0.3], 3, [0]),
        ([], 3, []),
    ],
)
def test_max_score_ranks_best_first(totals: list[float], k: int, expected: list[int]) -> None:
    assert MaxScorePicker(max_candidates=k).pick(QUERY, scored(totals)) == tuple(expected)


def test_ties_are_broken_at_random_so_equal_workers_share_the_burst() -> None:
    rng = random.Random(7)
    firsts = Counter(top_k([0.5] * 4 + [0.1] * 6, 1, rng)[0] for _ in range(4000))
    assert set(firsts) == {0, 1, 2, 3}
    assert all(800 < n < 1200 for n in firsts.values()), firsts


def test_ties_straddling_the_cut_are_sampled_uniformly() -> None:
    rng = random.Random(3)
    totals = [0.9, 0.5, 0.5, 0.5, 0.5, 0.1]
    seconds: Counter[int] = Counter()
    for _ in range(4000):
        first, second = top_k(totals, 2, rng)
        assert first == 0
        seconds[second] += 1
    assert set(seconds) == {1, 2, 3, 4}
    assert all(800 < n < 1200 for n in seconds.values()), seconds


def test_top_k_is_exact_with_or_without_a_shortlist() -> None:
    """Compared with a plain sort on random lists without ties: scanning all totals, or
    ranking a shortlist that holds the best k (plus arbitrary others), gives the same answer."""
    rng = random.Random(11)
    for trial in range(300):
        n = rng.randint(1, 80)
        totals = [rng.random() for _ in range(n)]
        k = rng.randint(1, 6)
        expected = sorted(range(n), key=totals.__getitem__, reverse=True)[:k]
        assert top_k(totals, k, rng) == expected, trial
        shortlist = set(expected) | set(rng.sample(range(n), min(n, 5)))
        assert top_k(totals, k, rng, shortlist) == expected, trial


def test_max_score_uses_the_shortlist_only_when_it_is_deep_enough() -> None:
    totals = [0.1, 0.9, 0.5, 0.7]
    rows = scored(totals).candidates
    deep = Scored(rows, totals, random.Random(0), hint=lambda: ({1, 3}, 2))
    assert MaxScorePicker(max_candidates=2).pick(QUERY, deep) == (1, 3)
    # depth 2 < 3 wanted: the picker must scan everything instead of trusting {1, 3}
    assert MaxScorePicker(max_candidates=3).pick(QUERY, deep) == (1, 3, 2)


def test_weighted_random_prefers_higher_scores_in_proportion() -> None:
    picker = WeightedRandomPicker(max_candidates=1)
    s = scored([0.6, 0.3, 0.1, 0.0], seed=5)
    firsts = Counter(picker.pick(QUERY, s)[0] for _ in range(6000))
    assert firsts[3] == 0
    assert 3300 < firsts[0] < 3900
    assert 1500 < firsts[1] < 2100
    assert 400 < firsts[2] < 800


def test_weighted_random_with_power_zero_is_uniform_and_ranks_without_repeats() -> None:
    picker = WeightedRandomPicker(max_candidates=3, power=0.0)
    s = scored([0.9, 0.1, 0.5, 0.2], seed=1)
    for _ in range(50):
        ranked = picker.pick(QUERY, s)
        assert len(ranked) == len(set(ranked)) == 3


def test_round_robin_rotates_through_candidates_ignoring_scores() -> None:
    picker = RoundRobinPicker(max_candidates=2)
    s = scored([0.9, 0.1, 0.5])
    assert [picker.pick(QUERY, s) for _ in range(4)] == [(0, 1), (1, 2), (2, 0), (0, 1)]
    assert picker.pick(QUERY, scored([])) == ()


def test_power_of_two_ranks_the_better_of_two_random_candidates_first() -> None:
    picker = PowerOfTwoPicker(choices=2, max_candidates=3)
    s = scored([0.9, 0.1, 0.5, 0.2, 0.7], seed=3)
    firsts = set()
    for _ in range(200):
        ranked = picker.pick(QUERY, s)
        assert len(ranked) == len(set(ranked)) == 3
        assert s.totals[ranked[0]] >= s.totals[ranked[1]]  # the better of the two drawn
        firsts.add(ranked[0])
    assert 1 not in firsts  # the worst can never win a pair
    assert len(firsts) > 1  # unlike max-score, it spreads over good-enough workers
    assert picker.pick(QUERY, scored([])) == ()


def test_max_score_near_equal_spreads_the_primary_over_near_ties_only() -> None:
    picker = MaxScorePicker(max_candidates=2, near_equal=0.02)
    totals = [0.80, 0.79, 0.70, 0.81, 0.50]
    firsts = Counter(picker.pick(QUERY, scored(totals, seed))[0] for seed in range(200))
    assert set(firsts) == {0, 1, 3}  # within 0.02 of the best (0.81); never 0.70 or 0.50
    assert min(firsts.values()) > 30  # uniform among them
    for seed in range(20):
        ranked = picker.pick(QUERY, scored(totals, seed))
        assert len(ranked) == 2
        assert len(set(ranked)) == 2


def test_max_score_near_equal_keeps_a_clear_best() -> None:
    picker = MaxScorePicker(max_candidates=3, near_equal=0.05)
    assert all(picker.pick(QUERY, scored([0.2, 0.9, 0.5], s)) == (1, 2, 0) for s in range(20))


def test_max_score_near_equal_is_range_checked() -> None:
    from services.router.scheduling.params import ParamError

    with pytest.raises(ParamError, match="near_equal"):
        MaxScorePicker(near_equal=1.5)


def test_max_score_near_equal_stays_in_the_best_ones_region_unless_told() -> None:
    rows = [
        WorkerSnapshot(worker_id="near-1", region="near", address="a"),
        WorkerSnapshot(worker_id="near-2", region="near", address="a"),
        WorkerSnapshot(worker_id="far-1", region="far", address="a"),
    ]
    totals = [0.80, 0.79, 0.795]

    def firsts(picker: MaxScorePicker) -> set[int]:
        return {
            picker.pick(QUERY, Scored(Candidates(rows), totals, random.Random(s)))[0]
            for s in range(100)
        }

    assert firsts(MaxScorePicker(near_equal=0.05)) == {0, 1}
    assert firsts(MaxScorePicker(near_equal=0.05, near_equal_across=True)) == {0, 1, 2}


def test_max_score_near_equal_never_draws_away_from_a_clear_affinity() -> None:
    """The best one holds the prompt's prefix, a boost larger than the band: near-equal cold
    workers are not drawn in its place, workers with as much affinity still share the draw,
    and a boost smaller than the band is drawn over like any other difference."""
    rows = scored([0.0, 0.0, 0.0, 0.0]).candidates
    totals = [0.85, 0.74, 0.84, 0.60]

    def firsts(boosts: dict[int, float]) -> set[int]:
        return {
            MaxScorePicker(near_equal=0.12).pick(
                QUERY, Scored(rows, totals, random.Random(s), boosts=boosts)
            )[0]
            for s in range(200)
        }

    assert firsts({}) == {0, 1, 2}
    assert firsts({0: 0.15}) == {0}
    assert firsts({0: 0.15, 2: 0.15}) == {0, 2}
    assert firsts({0: 0.05}) == {0, 1, 2}  # within the noise the band is for
    assert firsts({1: 0.15}) == {0, 1, 2}  # the best holds nothing: the draw is as before


def test_max_score_near_equal_draws_only_where_another_router_sends() -> None:
    """A router that is its workers' only source counts its requests in flight exactly: the
    band (insurance against other routers' unseen picks) is not drawn, the best one wins. One
    worker of the region that another source sends to turns the draw back on, for the region;
    a shared worker in another region does not, unless the band spans regions."""

    def rows(shared: dict[int, bool]) -> Candidates:
        regions = ["near", "near", "near", "far"]
        return Candidates(
            [
                WorkerSnapshot(
                    worker_id=f"w{i}", region=r, address="a", shared=shared.get(i, False)
                )
                for i, r in enumerate(regions)
            ]
        )

    totals = [0.80, 0.79, 0.50, 0.795]

    def firsts(picker: MaxScorePicker, shared: dict[int, bool]) -> set[int]:
        cands = rows(shared)
        return {picker.pick(QUERY, Scored(cands, totals, random.Random(s)))[0] for s in range(100)}

    picker = MaxScorePicker(near_equal=0.05)
    assert firsts(picker, {}) == {0}
    assert firsts(picker, {3: True}) == {0}  # another region's sharing is not this one's
    assert firsts(picker, {2: True}) == {0, 1}  # a worker outside the band, same region
    across = MaxScorePicker(near_equal=0.05, near_equal_across=True)
    assert firsts(across, {}) == {0}
    assert firsts(across, {3: True}) == {0, 1, 3}
    assert WorkerSnapshot(worker_id="x", region="r", address="a").shared  # unknown: shared
