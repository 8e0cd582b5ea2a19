"""``residency``: data residency, a hard constraint.

Intent: a request whose tenant or policy restricts processing to some regions is never served
elsewhere, however loaded those regions are (the decision comes back REGION_NOT_ALLOWED or
SATURATED instead). Input: ``query.allowed_regions`` (empty: any region) and ``worker.region``.
Parameters: none. Memoised per set of allowed regions (policies use few distinct sets).
Profiles must include this filter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params
from services.router.scheduling.plugin import PluginContext, WorkerFilter
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class ResidencyFilter(WorkerFilter[frozenset[str]]):
    TYPE: ClassVar[str] = "residency"

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls()

    def key(self, query: RouteQuery) -> frozenset[str]:
        return query.allowed_regions

    def reject(self, workers: Sequence[WorkerSnapshot], key: frozenset[str]) -> list[str | None]:
        if not key:
            return [None] * len(workers)
        regions = ", ".join(sorted(key))
        return [
            None if w.region in key else f"region '{w.region}' not in ({regions})" for w in workers
        ]

    def readmits_in_s(self, rejected: Sequence[WorkerSnapshot]) -> float | None:
        return math.inf  # the request's residency: time alone does not change it
