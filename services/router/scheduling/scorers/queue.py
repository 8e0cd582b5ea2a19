"""``queue``: prefer workers with free batch slots.

    pressure = (running + waiting + in_flight) / max_running
    score    = 1 - pressure / full_at          (0 from full_at up)

Intent: a request sent to a worker whose batch is full waits in its queue before its first
token (TTFT grows with every request ahead of it). ``in_flight`` counts what this router has
sent since the worker's last report, so a burst between two reports spreads out instead of
herding onto the emptiest worker of the last report.

Input: ``running``, ``waiting``, ``in_flight``, ``max_running``. Parameters: ``full_at``
(> 0, default 1.0: the pressure that scores 0; raise it to tell queued workers apart).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params, check_positive
from services.router.scheduling.plugin import PluginContext, WorkerScorer
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueScorer(WorkerScorer[None]):
    TYPE: ClassVar[str] = "queue"
    full_at: float = 1.0

    def __post_init__(self) -> None:
        check_positive(self.full_at, "full_at")

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(full_at=params.number("full_at", 1.0))

    def key(self, query: RouteQuery) -> None:
        return None

    def scores(self, workers: Sequence[WorkerSnapshot], key: None) -> list[float]:
        f = self.full_at
        return [
            1.0 - (w.running + w.waiting + w.in_flight) / ((w.max_running or 1) * f)
            for w in workers
        ]

    def describe(self, worker: WorkerSnapshot, key: None) -> str:
        w = worker
        return f"slots={w.running}+{w.waiting}+{w.in_flight}/{w.max_running}"
