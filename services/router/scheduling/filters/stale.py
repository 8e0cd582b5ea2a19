"""``fresh-report``: the worker's last load report is recent enough to trust.

Intent: every capacity signal comes from load reports; a worker that stopped reporting (a
partition, a hung process) may be fine or dead, and its numbers describe the past. Past
``max_age_s`` it is treated as unhealthy. This is a backstop: the fleet already marks a
silent worker down (its own ``stale_after_s``); a profile can be stricter.

Input: ``worker.report_age_s`` (age when the snapshot was built). Parameters: ``max_age_s``
(> 0, default 3.0). Memoised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params, check_positive
from services.router.scheduling.plugin import PluginContext, WorkerFilter
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class FreshReportFilter(WorkerFilter[None]):
    TYPE: ClassVar[str] = "fresh-report"
    max_age_s: float = 3.0

    def __post_init__(self) -> None:
        check_positive(self.max_age_s, "max_age_s")

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(max_age_s=params.number("max_age_s", 3.0))

    def key(self, query: RouteQuery) -> None:
        return None

    def reject(self, workers: Sequence[WorkerSnapshot], key: None) -> list[str | None]:
        limit = self.max_age_s
        return [
            None
            if w.report_age_s <= limit
            else f"no load report for {w.report_age_s:.1f}s (max {limit:g}s)"
            for w in workers
        ]
