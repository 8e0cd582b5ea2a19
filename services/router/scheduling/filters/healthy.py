"""``healthy``: the fleet considers the worker up.

Intent: a worker whose load stream broke, or that the fleet marked down for any other
reason, must not receive requests. Input: ``worker.healthy``, ``worker.health_detail`` (the
reason, quoted in the rejection). Parameters: none. Memoised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params
from services.router.scheduling.plugin import PluginContext, WorkerFilter
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthyFilter(WorkerFilter[None]):
    TYPE: ClassVar[str] = "healthy"

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls()

    def key(self, query: RouteQuery) -> None:
        return None

    def reject(self, workers: Sequence[WorkerSnapshot], key: None) -> list[str | None]:
        return [None if w.healthy else f"unhealthy: {w.health_detail}" for w in workers]
