"""The default profile on the founding example: a cluster at 95 % is skipped for one at 45 %
even if farther, while a near and lightly loaded one wins. One row per scenario."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from services.common.clock import ManualClock
from services.router.scheduling.profile import load_profile
from services.router.scheduling.types import (
    ModelState,
    ModelStatus,
    NoCandidate,
    Priority,
    RouteQuery,
    WorkerSnapshot,
)

PROFILE = Path(__file__).resolve().parents[3] / "deploy/router/profiles/default.yaml"


def region(name: str, rtt_ms: float | None, load: float, **kw: Any) -> WorkerSnapshot:
    """A regional worker at ``load``: that share of its 100 batch slots and of its KV cache
    in use, its GPU as busy, its streams decoding at 30 tokens/s each."""
    running = round(load * 100)
    fields: dict[str, Any] = {
        "address": f"{name}:7000",
        "models": (ModelStatus("m", ModelState.READY),),
        "rtt_ms": rtt_ms,
        "running": running,
        "max_running": 100,
        "kv_cache_usage": load,
        "gpu_utilization": load,
        "tokens_per_second": 30.0 * running,
    }
    fields.update(kw)
    return WorkerSnapshot(worker_id=name, region=name, **fields)


SCENARIOS = [
    # (why, workers, priority, expected primary)
    (
        "near at 95 % loses to far at 45 %",
        [region("near", 2, 0.95), region("far", 60, 0.45)],
        "far",
    ),
    ("both light: the near one wins", [region("near", 2, 0.10), region("far", 60, 0.15)], "near"),
    ("both light, far idle: still near", [region("near", 2, 0.20), region("far", 60, 0.0)], "near"),
    ("near at 80 % vs far at 20 %: far", [region("near", 2, 0.80), region("far", 60, 0.20)], "far"),
    ("near 95 % vs very far at 45 %", [region("near", 2, 0.95), region("far", 150, 0.45)], "far"),
    (
        "equal load: lower RTT wins",
        [region("a", 30, 0.5), region("b", 10, 0.5), region("c", 90, 0.5)],
        "b",
    ),
    ("lossy path loses a close call", [region("a", 10, 0.3, loss=0.04), region("b", 12, 0.3)], "b"),
    ("unknown RTT is not preferred", [region("a", 40, 0.3), region("b", None, 0.3)], "a"),
]


@pytest.mark.parametrize(("why", "workers", "winner"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_default_profile_picks(why: str, workers: list[WorkerSnapshot], winner: str) -> None:
    scheduler = load_profile(PROFILE, clock=ManualClock(), rng=random.Random(0))
    decision = scheduler.schedule(RouteQuery(request_id="r", model="m"), workers)
    assert decision.ranked[0].worker.worker_id == winner, decision.explanation
    scores = [r.score for r in decision.ranked]
    assert scores == sorted(scores, reverse=True)
    assert len(decision.ranked) == min(3, len(workers))


@pytest.mark.parametrize(
    ("priority", "outcome"),
    [
        # near at 96 %, far at 99 %: LOW is refused by both, STANDARD goes near, HIGH too
        (Priority.LOW, None),
        (Priority.STANDARD, "near"),
        (Priority.HIGH, "near"),
    ],
)
def test_default_profile_admission_by_priority(priority: Priority, outcome: str | None) -> None:
    scheduler = load_profile(PROFILE, clock=ManualClock(), rng=random.Random(0))
    workers = [region("near", 2, 0.96), region("far", 60, 0.99)]
    decision = scheduler.schedule(RouteQuery(request_id="r", model="m", priority=priority), workers)
    if outcome is None:
        assert decision.empty_reason is NoCandidate.SATURATED
        assert decision.retry_after_s == 1.0
    else:
        assert decision.ranked[0].worker.worker_id == outcome


def test_default_profile_keeps_a_conversation_on_its_worker_in_a_close_call() -> None:
    scheduler = load_profile(PROFILE, clock=ManualClock(), rng=random.Random(0))
    workers = [region("a", 10, 0.30), region("b", 10, 0.32)]
    first = RouteQuery(request_id="1", model="m", session_id="s", prefix_hashes=(11, 12, 13))
    second = RouteQuery(request_id="2", model="m", session_id="s", prefix_hashes=(11, 12, 13, 14))
    assert scheduler.schedule(first, workers).ranked[0].worker.worker_id == "a"
    # Now b is slightly less loaded, but a holds the session and 3/4 of the prompt's blocks.
    workers = [region("a", 10, 0.32), region("b", 10, 0.30)]
    decision = scheduler.schedule(second, workers)
    assert decision.ranked[0].worker.worker_id == "a", decision.explanation
    assert "prefix-affinity +" in decision.explanation


def test_default_profile_affinity_yields_to_a_clearly_busier_worker() -> None:
    scheduler = load_profile(PROFILE, clock=ManualClock(), rng=random.Random(0))
    query = RouteQuery(request_id="1", model="m", session_id="s", prefix_hashes=(1, 2))
    assert (
        scheduler.schedule(query, [region("a", 10, 0.3), region("b", 10, 0.4)])
        .ranked[0]
        .worker.worker_id
        == "a"
    )
    decision = scheduler.schedule(query, [region("a", 10, 0.9), region("b", 10, 0.4)])
    assert decision.ranked[0].worker.worker_id == "b", decision.explanation
