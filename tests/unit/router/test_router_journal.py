"""The decision journal (last N decisions, counters) and per-plugin timing statistics."""

from __future__ import annotations

import pytest

from services.router.journal import DecisionJournal, JournalEntry, PluginTimings
from services.router.scheduling.types import (
    Decision,
    NoCandidate,
    Priority,
    RouteQuery,
    ScoredWorker,
    WorkerSnapshot,
)


def routed(i: int, region: str = "kr") -> JournalEntry:
    w = WorkerSnapshot(worker_id=f"{region}-1", region=region, address="a:1")
    return JournalEntry(
        float(i), f"d{i}", RouteQuery(f"r{i}", "m"), Decision(ranked=(ScoredWorker(w, 0.5),)), 9.0
    )


def empty(i: int, priority: Priority, reason: NoCandidate) -> JournalEntry:
    query = RouteQuery(f"r{i}", "m", priority=priority)
    return JournalEntry(float(i), "", query, Decision(ranked=(), empty_reason=reason), 5.0)


def test_recent_decisions_are_newest_first_and_bounded() -> None:
    journal = DecisionJournal(capacity=3)
    for i in range(5):
        journal.record(routed(i))
    assert [e.decision_id for e in journal.recent(10)] == ["d4", "d3", "d2"]
    assert [e.decision_id for e in journal.recent(2)] == ["d4", "d3"]
    assert journal.recent(0) == []


def test_counters_say_where_traffic_went_and_which_tiers_were_shed() -> None:
    journal = DecisionJournal(capacity=2)
    journal.record(routed(1, "kr"))
    journal.record(routed(2, "jp"))
    journal.record(routed(3, "jp"))
    journal.record(empty(4, Priority.LOW, NoCandidate.SATURATED))
    journal.record(empty(5, Priority.LOW, NoCandidate.SATURATED))
    journal.record(empty(6, Priority.HIGH, NoCandidate.REGION_NOT_ALLOWED))
    assert journal.routed_by_region == {"kr": 1, "jp": 2}
    assert journal.empty_by_reason == {("saturated", "low"): 2, ("region_not_allowed", "high"): 1}


def test_timing_percentiles_cover_the_last_window() -> None:
    timings = PluginTimings(window=100)
    for i in range(1, 201):  # only 101..200 stay in the window
        timings.record({"latency": float(i), "total": 2.0 * i})
    summary = timings.summary()
    assert timings.decisions == 200
    assert summary["latency"].decisions == 100
    assert summary["latency"].p50_us == 150.0
    assert summary["latency"].p99_us == 199.0
    assert summary["latency"].max_us == 200.0
    assert summary["total"].mean_us == pytest.approx(301.0)


@pytest.mark.parametrize("bad", [0, -1])
def test_bounds_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="capacity"):
        DecisionJournal(capacity=bad)
    with pytest.raises(ValueError, match="window"):
        PluginTimings(window=bad)


def test_the_empty_decision_log_says_once_a_second_how_many_it_left_out() -> None:
    from services.router.service import LogThrottle

    throttle = LogThrottle(interval_s=1.0)
    key = ("saturated", "low")
    assert throttle.allow(key, 10.0) == 0
    assert throttle.allow(key, 10.2) is None
    assert throttle.allow(key, 10.9) is None
    assert throttle.allow(("saturated", "high"), 10.9) == 0  # another key is independent
    assert throttle.allow(key, 11.0) == 2
