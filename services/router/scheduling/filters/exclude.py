"""``exclude``: leave out the workers this request already tried.

Intent: the edge retries a failed attempt (before the first token) on another worker; it
sends the ids it tried in ``exclude_worker_ids`` so the retry cannot land on the same one.
Input: ``query.exclude_worker_ids``. Parameters: none.

Not memoised (the set differs per retry); when the set is empty the input is returned as is,
so it costs nothing on first attempts. Profiles list it first, before the memoised filters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params
from services.router.scheduling.plugin import Filter, PluginContext
from services.router.scheduling.types import Rejection, RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class ExcludeFilter(Filter):
    TYPE: ClassVar[str] = "exclude"

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls()

    def filter(
        self, query: RouteQuery, workers: Sequence[WorkerSnapshot]
    ) -> tuple[Sequence[WorkerSnapshot], list[Rejection]]:
        excluded = query.exclude_worker_ids
        if not excluded:
            return workers, []
        kept = [w for w in workers if w.worker_id not in excluded]
        rejected = [
            Rejection(w.worker_id, w.region, self.TYPE, "already tried for this request")
            for w in workers
            if w.worker_id in excluded
        ]
        return kept, rejected

    def readmits_in_s(self, rejected: Sequence[WorkerSnapshot]) -> float | None:
        return math.inf  # this request's tried workers: time alone does not change it
