"""The oscillation index: the traffic split between regions, window to window."""

from __future__ import annotations

import itertools
import random
import tracemalloc
from collections import Counter

import pytest

from services.planet.metrics import Metrics


def metrics(window_s: float) -> Metrics:
    return Metrics(
        slo_ttft_ms=500, slo_itl_ms=None, interval_s=60, window_s=window_s, sample_size=0, seed=1
    )


def by_hand(routes: list[tuple[float, str]], window_s: float) -> float:
    """Half the L1 distance between consecutive non-empty windows' splits, averaged (the open
    last window left out), written the long way."""
    windows: dict[int, Counter[str]] = {}
    for t, region in routes:
        windows.setdefault(int(t // window_s), Counter())[region] += 1
    last = int(routes[-1][0] // window_s)
    closed = [windows[k] for k in sorted(windows) if k != last]
    if len(closed) < 2:
        return 0.0
    total = 0.0
    for a, b in itertools.pairwise(closed):
        na, nb = sum(a.values()), sum(b.values())
        total += 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))
    return total / (len(closed) - 1)


@pytest.mark.parametrize("window_s", [0.5, 3.0, 10.0])
def test_the_index_is_the_mean_share_moved_between_windows_that_saw_traffic(
    window_s: float,
) -> None:
    rng = random.Random(7)
    t, routes = 0.0, []
    for _ in range(2000):
        t += rng.expovariate(5.0) if rng.random() < 0.97 else rng.uniform(20, 60)  # some gaps
        routes.append((t, rng.choice("aab" if t < 150 else "bbc")))
    m = metrics(window_s)
    for when, region in routes:
        m.routed(when, region)
    assert m.oscillation() == pytest.approx(by_hand(routes, window_s))
    assert m.oscillation() > 0


def test_steady_traffic_has_no_oscillation() -> None:
    m = metrics(1.0)
    for i in range(100):
        m.routed(i * 0.25, "a")
    assert m.oscillation() == 0.0


def test_many_windows_take_no_more_memory_than_a_few() -> None:
    """A run of an hour in 10 ms windows is 360,000 windows: the index must be kept as it
    goes, not as a list of every window's counts."""
    m = metrics(0.01)
    for i in range(100):  # warm up: the first windows' allocations
        m.routed(i * 0.01, "ab"[i % 2])
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(100, 20_100):
        m.routed(i * 0.01, "ab"[i % 2])
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 50_000, grown  # a list of 20,000 Counters would be megabytes
    assert m.oscillation() == pytest.approx(1.0)


def test_a_long_quiet_gap_is_crossed_in_one_step() -> None:
    m = metrics(0.01)
    m.routed(0.0, "a")
    m.routed(3_600.0 * 24 * 7, "b")  # a week later: 60 million empty windows between
    m.routed(3_600.0 * 24 * 7 + 0.02, "b")
    assert m.oscillation() == pytest.approx(1.0)


def test_goodput_counts_unfinished_requests_as_misses_unless_asked_for_resolved_ones() -> None:
    m = metrics(10.0)
    for _ in range(3):
        m.arrival("standard")
    m.done("seoul", "kr", "standard", ttft_ms=100, itl_ms=None, e2e_ms=900)  # good
    m.refuse("standard", "saturated")  # a miss
    # the third is still streaming when the run stops
    assert m.goodput() == pytest.approx(1 / 3)
    assert m.goodput(resolved_only=True) == pytest.approx(1 / 2)
    assert m.goodput(["standard"], resolved_only=True) == pytest.approx(1 / 2)
