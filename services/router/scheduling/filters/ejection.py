"""``failure-ejection``: outlier detection — eject a worker that keeps failing.

Intent: a worker that accepts requests and then fails them (a broken GPU, an engine in a
crash loop) looks healthy to probes and load reports. After ``max_failures`` failed attempts
in the fleet's failure window it is ejected; it comes back by itself once old failures
leave that window (Envoy's outlier detection, with the window as the ejection time).

Input: ``worker.recent_failures`` (failed outcomes the edge reported within the fleet's
window). Parameters: ``max_failures`` (integer ≥ 1, default 3). Memoised. When every
worker is ejected, the 503's Retry-After is when the first one comes back
(``worker.failures_clear_in_s``), not the profile's default second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params, require
from services.router.scheduling.plugin import PluginContext, WorkerFilter
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureEjectionFilter(WorkerFilter[None]):
    TYPE: ClassVar[str] = "failure-ejection"
    max_failures: int = 3

    def __post_init__(self) -> None:
        require(self.max_failures >= 1, "max_failures", "must be >= 1")

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(max_failures=params.integer("max_failures", 3))

    def key(self, query: RouteQuery) -> None:
        return None

    def reject(self, workers: Sequence[WorkerSnapshot], key: None) -> list[str | None]:
        limit = self.max_failures
        return [
            None
            if w.recent_failures < limit
            else f"ejected: {w.recent_failures} recent failures (limit {limit})"
            for w in workers
        ]

    def readmits_in_s(self, rejected: Sequence[WorkerSnapshot]) -> float | None:
        # Back once all but max_failures - 1 of its failures have left the window.
        limit = self.max_failures
        times = [
            w.failures_clear_in_s[len(w.failures_clear_in_s) - limit]
            for w in rejected
            if len(w.failures_clear_in_s) >= limit
        ]
        if len(times) < len(rejected):
            return None  # some worker's failure times are unknown
        return max(0.0, min(times)) if times else None
