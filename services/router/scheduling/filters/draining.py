"""``not-draining``: the worker is not shutting down.

Intent: a draining worker finishes the streams it has and takes no new ones (graceful
shutdown, rolling upgrades). Input: ``worker.draining``. Parameters: none. Memoised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params
from services.router.scheduling.plugin import PluginContext, WorkerFilter
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class NotDrainingFilter(WorkerFilter[None]):
    TYPE: ClassVar[str] = "not-draining"

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls()

    def key(self, query: RouteQuery) -> None:
        return None

    def reject(self, workers: Sequence[WorkerSnapshot], key: None) -> list[str | None]:
        return ["draining" if w.draining else None for w in workers]
