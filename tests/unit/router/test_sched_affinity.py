"""Prefix-cache and session affinity: stateful scorers that learn from decisions (post-pick
hook), with bounded, expiring memory. Time comes from a ManualClock."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.clock import ManualClock
from services.router.scheduling.plugin import Candidates
from services.router.scheduling.scorers.prefix_affinity import PrefixAffinityScorer
from services.router.scheduling.scorers.session_affinity import SessionAffinityScorer
from services.router.scheduling.types import Decision, RouteQuery, ScoredWorker, WorkerSnapshot


def w(worker_id: str, **kw: Any) -> WorkerSnapshot:
    return WorkerSnapshot(worker_id=worker_id, region="eu", address="a:1", max_running=10, **kw)


ROWS = Candidates([w("a"), w("b"), w("c")])


def decided(worker_id: str) -> Decision:
    return Decision(ranked=(ScoredWorker(worker=w(worker_id), score=1.0),))


def prompt(*blocks: int, session: str = "") -> RouteQuery:
    return RouteQuery(request_id="r", model="m", prefix_hashes=blocks, session_id=session)


# --- prefix affinity ------------------------------------------------------------------------


def test_prefix_affinity_scores_the_worker_that_served_the_longest_matching_prefix() -> None:
    scorer = PrefixAffinityScorer(clock=ManualClock())
    scorer.observe(prompt(1, 2, 3, 4), decided("a"))  # a has blocks 1..4
    scorer.observe(prompt(1, 2, 9), decided("b"))  # b re-served blocks 1, 2 (most recent)
    rows = [
        (prompt(1, 2, 3, 4, 5, 6, 7, 8), {"b": 2 / 8, "a": 4 / 8}),
        (prompt(1, 2, 3, 4), {"b": 0.5, "a": 1.0}),
        (prompt(1, 2, 9, 10), {"b": 3 / 4}),
        (prompt(7, 1, 2), {}),  # chained hashes: a different first block shares nothing
        (prompt(), {}),
    ]
    for query, expected in rows:
        assert scorer.score(query, ROWS) == pytest.approx(expected), query.prefix_hashes


@pytest.mark.parametrize(
    ("rtts", "expected"),
    [
        ({"a": 5.0, "b": 4.0}, {"a": 1.0}),  # a little further: affinity counts
        ({"a": 140.0, "b": 4.0}, {"a": 0.0}),  # an ocean away: not worth the trip
        ({"a": 34.0, "b": 4.0}, {"a": 1.0}),  # exactly at the 30 ms allowance
        ({"a": None, "b": 4.0}, {"a": 1.0}),  # unmeasured: no evidence it is far
    ],
)
def test_prefix_affinity_does_not_pull_requests_to_far_regions(
    rtts: dict[str, float | None], expected: dict[str, float]
) -> None:
    scorer = PrefixAffinityScorer(clock=ManualClock(), max_extra_rtt_ms=30)
    scorer.observe(prompt(1, 2), decided("a"))
    rows = Candidates([w(wid, rtt_ms=rtt) for wid, rtt in rtts.items()])
    assert scorer.score(prompt(1, 2), rows) == expected


def test_prefix_affinity_detail_names_matched_blocks() -> None:
    scorer = PrefixAffinityScorer(clock=ManualClock())
    scorer.observe(prompt(1, 2), decided("a"))
    query = prompt(1, 2, 3, 4)
    assert scorer.detail(query, w("a")) == "prefix=2/4 blocks"
    assert scorer.detail(query, w("b")) == "prefix=0/4 blocks"
    assert scorer.detail(prompt(), w("a")) == "no prefix"


def test_prefix_affinity_entries_expire_after_ttl() -> None:
    clock = ManualClock()
    scorer = PrefixAffinityScorer(clock=clock, ttl_s=60)
    scorer.observe(prompt(1, 2), decided("a"))
    clock.advance(59)
    assert scorer.score(prompt(1, 2), ROWS) == {"a": 1.0}
    clock.advance(2)
    assert scorer.score(prompt(1, 2), ROWS) == {}
    scorer.observe(prompt(5), decided("b"))  # any observation sweeps expired entries
    assert len(scorer) == 1


def test_prefix_affinity_memory_is_bounded_least_recently_used_first() -> None:
    scorer = PrefixAffinityScorer(clock=ManualClock(), max_entries=4)
    scorer.observe(prompt(1, 2), decided("a"))
    scorer.observe(prompt(3, 4), decided("b"))
    scorer.observe(prompt(1, 2), decided("a"))  # touch 1, 2: now 3, 4 are the oldest
    scorer.observe(prompt(5, 6), decided("c"))
    assert len(scorer) == 4
    assert scorer.score(prompt(3, 4), ROWS) == {}
    assert scorer.score(prompt(1, 2), ROWS) == {"a": 1.0}
    assert scorer.score(prompt(5, 6), ROWS) == {"c": 1.0}


def test_prefix_affinity_uses_only_the_first_max_blocks() -> None:
    scorer = PrefixAffinityScorer(clock=ManualClock(), max_blocks=2)
    scorer.observe(prompt(1, 2, 3, 4), decided("a"))
    assert len(scorer) == 2
    assert scorer.score(prompt(1, 2, 3, 4), ROWS) == {"a": 1.0}


def test_prefix_affinity_learns_nothing_from_an_empty_decision() -> None:
    scorer = PrefixAffinityScorer(clock=ManualClock())
    scorer.observe(prompt(1, 2), Decision(ranked=()))
    assert len(scorer) == 0


# --- session affinity -----------------------------------------------------------------------


def test_session_affinity_prefers_the_worker_that_served_the_last_turn() -> None:
    scorer = SessionAffinityScorer(clock=ManualClock())
    scorer.observe(prompt(session="s1"), decided("b"))
    assert scorer.score(prompt(session="s1"), ROWS) == {"b": 1.0}
    assert scorer.score(prompt(session="s2"), ROWS) == {}
    assert scorer.score(prompt(), ROWS) == {}
    assert scorer.detail(prompt(session="s1"), w("b")) == "session here"
    assert scorer.detail(prompt(session="s1"), w("a")) == "session on b"
    assert scorer.detail(prompt(session="s2"), w("a")) == "new session"


@pytest.mark.parametrize(
    ("holder", "score"),
    [
        (w("b", running=5), {"b": 1.0}),
        (w("b", running=8), {"b": 1.0}),  # load 0.8 < 0.85
        (w("b", running=9), {}),  # load 0.9: overloaded, affinity yields
        (w("b", running=2, kv_cache_usage=0.95), {}),
    ],
)
def test_session_affinity_yields_when_the_holder_is_overloaded(
    holder: WorkerSnapshot, score: dict[str, float]
) -> None:
    scorer = SessionAffinityScorer(clock=ManualClock(), max_load=0.85)
    scorer.observe(prompt(session="s1"), decided("b"))
    assert scorer.score(prompt(session="s1"), Candidates([w("a"), holder])) == score


def test_session_affinity_ignores_a_holder_that_is_not_a_candidate() -> None:
    scorer = SessionAffinityScorer(clock=ManualClock())
    scorer.observe(prompt(session="s1"), decided("zz"))
    assert scorer.score(prompt(session="s1"), ROWS) == {}


def test_session_moves_with_the_next_decision_and_expires() -> None:
    clock = ManualClock()
    scorer = SessionAffinityScorer(clock=clock, ttl_s=100)
    scorer.observe(prompt(session="s1"), decided("a"))
    scorer.observe(prompt(session="s1"), decided("c"))
    assert scorer.holder("s1") == "c"
    clock.advance(101)
    assert scorer.holder("s1") is None


def test_session_memory_is_bounded() -> None:
    scorer = SessionAffinityScorer(clock=ManualClock(), max_entries=2)
    for s in ("s1", "s2", "s3"):
        scorer.observe(prompt(session=s), decided("a"))
    assert len(scorer) == 2
    assert scorer.holder("s1") is None
    assert scorer.holder("s3") == "a"


def test_session_affinity_lets_a_conversation_leave_a_far_region() -> None:
    scorer = SessionAffinityScorer(clock=ManualClock(), max_extra_rtt_ms=50)
    scorer.observe(prompt(session="s1"), decided("a"))
    near = Candidates([w("a", rtt_ms=40.0), w("b", rtt_ms=4.0)])
    far = Candidates([w("a", rtt_ms=140.0), w("b", rtt_ms=4.0)])
    assert scorer.score(prompt(session="s1"), near) == {"a": 1.0}
    assert scorer.score(prompt(session="s1"), far) == {}
