"""Builders the test tables share: a worker snapshot, a route query, a scheduling profile,
an edge config. One definition each, so a new required field is added in one place.

Short names on purpose (``w("kr-1", rtt_ms=4.0)``): tests are tables of these.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

from services.edge.server import EdgeConfig
from services.edge.upstream.failover import FailoverPolicy
from services.router.scheduling.filters.capability import CapabilityFilter
from services.router.scheduling.filters.healthy import HealthyFilter
from services.router.scheduling.filters.model import ModelReadyFilter
from services.router.scheduling.filters.residency import ResidencyFilter
from services.router.scheduling.framework import SchedulerProfile, WeightedScorer
from services.router.scheduling.pickers.max_score import MaxScorePicker
from services.router.scheduling.plugin import Filter
from services.router.scheduling.types import ModelState, ModelStatus, RouteQuery, WorkerSnapshot

#: The in-process edges' admin token (tests only).
TEST_ADMIN_TOKEN = "meridian-test-admin-token"

#: Model ``m``, ready: what most table rows serve.
READY = (ModelStatus("m", ModelState.READY),)


def w(worker_id: str, **kw: Any) -> WorkerSnapshot:
    """A worker in region ``eu`` serving ``m``, with any field overridden."""
    fields: dict[str, Any] = {"region": "eu", "address": f"{worker_id}:1", "models": READY}
    fields.update(kw)
    return WorkerSnapshot(worker_id=worker_id, **fields)


def q(**kw: Any) -> RouteQuery:
    """A query for model ``m``, with any field overridden."""
    return RouteQuery(**{"request_id": "r", "model": "m", **kw})


def profile(
    *scorers: WeightedScorer, filters: Sequence[Filter] = (), k: int = 3, seed: int = 1
) -> SchedulerProfile:
    """Residency, model-ready, capability and healthy (memoised, in that order), then
    ``filters``; a max-score picker keeping ``k``; a seeded tie-breaker. Like every profile
    the loader accepts, it has the required filters."""
    base: list[Filter] = [
        ResidencyFilter(),
        ModelReadyFilter(),
        CapabilityFilter(),
        HealthyFilter(),
    ]
    return SchedulerProfile(
        filters=[*base, *filters],
        scorers=scorers,
        picker=MaxScorePicker(max_candidates=k),
        rng=random.Random(seed),
    )


def edge_config(**over: Any) -> EdgeConfig:
    """A test edge: free ports, plain HTTP, an admin API with the test token, a patient
    first-token timeout; any field overridden. ``MERIDIAN_TEST_WORKER_TRANSPORT=call`` runs
    every test edge's streams as one Generate call each (the default is GenerateMux), so the
    suite can prove either transport."""
    fields: dict[str, Any] = {
        "worker_transport": os.environ.get("MERIDIAN_TEST_WORKER_TRANSPORT", "mux"),
        "port": 0,
        "site": "test",
        "plain_http": True,
        "admin_port": 0,
        "admin_token": TEST_ADMIN_TOKEN,
        "failover": FailoverPolicy(first_token_timeout_s=10.0),
    }
    fields.update(over)
    return EdgeConfig(**fields)
