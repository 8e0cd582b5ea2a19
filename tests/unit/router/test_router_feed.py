"""The router's feed for consoles: what a watcher has not seen, summarised; what it missed,
counted; one request's decisions found again."""

from __future__ import annotations

from meridian.v1 import router_pb2
from services.router.feed import FeedConfig, FleetFeed, summarise
from services.router.journal import DecisionJournal, JournalEntry
from services.router.scheduling.types import (
    Contribution,
    Decision,
    NoCandidate,
    Priority,
    Rejection,
    ScoredWorker,
)
from tests.support.builders import q, w


def routed(request_id: str, winner: str = "kr-1", runner: str = "jp-1") -> JournalEntry:
    def scored(wid: str, region: str, latency: float) -> ScoredWorker:
        return ScoredWorker(
            w(wid, region=region),
            latency + 0.2,
            (Contribution("latency", 1.0, 1.0, latency), Contribution("queue", 1.0, 1.0, 0.2)),
        )

    decision = Decision(
        ranked=(scored(winner, "kr", 0.5), scored(runner, "jp", 0.1)),
        rejected=(Rejection("us-1", "us", "admission", "load 0.99"),),
        explanation="kr-1 beat jp-1",
    )
    return JournalEntry(1000.5, f"d-{request_id}", q(request_id=request_id), decision, 12.0)


def test_a_decision_is_summarised_with_its_deciding_signal_and_runner_up() -> None:
    s = summarise(routed("r1"))
    assert (s.worker_id, s.region, s.signal) == ("kr-1", "kr", "latency")
    assert (s.runner_up_worker_id, s.runner_up_region) == ("jp-1", "jp")
    assert s.at_unix_ms == 1000500
    assert (s.ranked, s.filtered, s.reroute) == (2, 1, False)


def test_an_empty_decision_is_summarised_by_its_reason() -> None:
    entry = JournalEntry(
        1.0,
        "",
        q(priority=Priority.LOW, exclude_worker_ids=frozenset({"kr-1"})),
        Decision(ranked=(), empty_reason=NoCandidate.SATURATED),
        3.0,
    )
    s = summarise(entry)
    assert (s.empty_reason, s.worker_id, s.priority, s.reroute) == (
        "saturated",
        "",
        router_pb2.PRIORITY_LOW,
        True,
    )


def test_a_watcher_gets_what_is_new_and_is_told_what_it_missed() -> None:
    journal = DecisionJournal(capacity=4)
    feed = FleetFeed(
        journal=journal,
        view=lambda: router_pb2.RouterView(router_site="x"),
        config=FeedConfig(max_decisions_per_update=3),
    )
    seen = feed.start_seq()
    for i in range(2):
        journal.record(routed(f"r{i}"))
    update, seen = feed.update(seen, with_view=True)
    assert [d.decision_id for d in update.decisions] == ["d-r0", "d-r1"]
    assert update.view.router_site == "x"
    assert update.decisions_skipped == 0
    assert [f.worker_id for f in update.latest_filtered] == ["us-1"]
    for i in range(2, 9):  # 7 more: 4 kept by the journal, 3 sent
        journal.record(routed(f"r{i}"))
    update, seen = feed.update(seen, with_view=False)
    assert not update.HasField("view")
    assert [d.decision_id for d in update.decisions] == ["d-r6", "d-r7", "d-r8"]
    assert update.decisions_skipped == 4
    update, _ = feed.update(seen, with_view=False)
    assert len(update.decisions) == 0
    assert update.latest_filtered_at_unix_ms == 0


def test_one_requests_decisions_are_found_oldest_first() -> None:
    journal = DecisionJournal(capacity=8)
    for rid in ("a", "b", "a"):
        journal.record(routed(rid))
    assert [e.query.request_id for e in journal.for_request("a")] == ["a", "a"]
    assert journal.for_request("zzz") == []


def test_intervals_default_and_have_floors() -> None:
    feed = FleetFeed(journal=DecisionJournal(), view=router_pb2.RouterView)
    assert feed.intervals(router_pb2.WatchFleetRequest()) == (1.0, 0.25)
    fast = router_pb2.WatchFleetRequest(view_interval_ms=1, decision_interval_ms=1)
    assert feed.intervals(fast) == (0.1, 0.05)
