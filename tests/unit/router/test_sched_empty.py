"""Empty decisions: why nothing is left (each reason maps to one gRPC status), when to retry,
and the one-line account of what removed the workers."""

from __future__ import annotations

from typing import Any

import pytest

from services.router.scheduling.filters.admission import AdmissionFilter
from services.router.scheduling.filters.ejection import FailureEjectionFilter
from services.router.scheduling.filters.exclude import ExcludeFilter
from services.router.scheduling.framework import WeightedScorer
from services.router.scheduling.scorers.kv_cache import KvCacheScorer
from services.router.scheduling.types import (
    ModelState,
    ModelStatus,
    NoCandidate,
    Priority,
    RouteQuery,
    WorkerSnapshot,
)
from tests.support.builders import profile, q, w

# --- empty decisions ------------------------------------------------------------------------


def full(worker_id: str, **kw: Any) -> WorkerSnapshot:
    return w(worker_id, **{"running": 99, "max_running": 100, **kw})


def ejected(worker_id: str, *clears_in_s: float) -> WorkerSnapshot:
    return w(worker_id, recent_failures=len(clears_in_s), failures_clear_in_s=clears_in_s)


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
        "every worker ejected: back when the first leaves its failure window",
        q(),
        [ejected("a", 5.0, 12.0, 20.0), ejected("b", 2.0, 3.0, 9.0, 25.0)],
        NoCandidate.UNAVAILABLE,
        3.0,  # b is down to 2 failures (under the limit of 3) once its second leaves
    ),
    (
        "ejected, or tried already",
        q(exclude_worker_ids=frozenset({"b"})),
        [ejected("a", 7.0, 8.0, 9.0), w("b")],
        NoCandidate.UNAVAILABLE,
        7.0,
    ),
    (
        "ejected, or down (which can end at any moment)",
        q(),
        [ejected("a", 7.0, 8.0, 9.0), w("b", healthy=False)],
        NoCandidate.UNAVAILABLE,
        1.0,
    ),
    (
        "ejected, back sooner than the default hint",
        q(),
        [ejected("a", 0.2, 8.0, 9.0)],
        NoCandidate.UNAVAILABLE,
        1.0,
    ),
    (
        "ejected, the failure times unknown",
        q(),
        [w("a", recent_failures=3)],
        NoCandidate.UNAVAILABLE,
        1.0,
    ),
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
    s = profile(
        WeightedScorer(KvCacheScorer(), 1),
        filters=[
            AdmissionFilter(retry_after_s=2.5),
            ExcludeFilter(),
            FailureEjectionFilter(max_failures=3),
        ],
    )
    decision = s.schedule(query, rows)
    assert decision.ranked == ()
    assert decision.empty_reason is reason
    assert decision.retry_after_s == retry
    assert decision.explanation.startswith(
        f"no candidate for model '{query.model}' ({reason.value})"
    )


def test_empty_explanation_counts_rejections_per_filter_with_an_example() -> None:
    s = profile(WeightedScorer(KvCacheScorer(), 1), filters=[AdmissionFilter()])
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
    s = profile(WeightedScorer(KvCacheScorer(), 1), filters=[AdmissionFilter()])
    rows = [full("a"), full("b")]
    low = q(priority=Priority.LOW)
    assert s.schedule(low, rows).empty_reason is NoCandidate.SATURATED
    assert s.schedule(low, rows).empty_reason is NoCandidate.SATURATED
    rows = [w("a", healthy=False), w("b", healthy=False)]
    assert s.schedule(low, rows).empty_reason is NoCandidate.UNAVAILABLE
    assert s.schedule(low, rows).empty_reason is NoCandidate.UNAVAILABLE
    rows[1] = w("b", running=10, max_running=100)
    assert [r.worker.worker_id for r in s.schedule(low, rows).ranked] == ["b"]
