"""``gpu``: prefer GPUs with idle time.

    score = 1 - gpu_utilization            (unknown_score when not reported)

Intent: a secondary capacity hint. NVML utilisation is the share of time a kernel ran, so it
separates idle from busy workers but not busy from overloaded (the queue and KV-cache signals
do that); give it a small weight. Hosts without NVML (CPU engines, the simulator) report
nothing and get a neutral score, so they are neither favoured nor punished.

Input: ``worker.gpu_utilization`` (0..1, or ``None``). Parameters: ``unknown_score``
(0..1, default 0.5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params, check_unit
from services.router.scheduling.plugin import PluginContext, WorkerScorer
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuScorer(WorkerScorer[None]):
    TYPE: ClassVar[str] = "gpu"
    unknown_score: float = 0.5

    def __post_init__(self) -> None:
        check_unit(self.unknown_score, "unknown_score")

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(unknown_score=params.number("unknown_score", 0.5))

    def key(self, query: RouteQuery) -> None:
        return None

    def scores(self, workers: Sequence[WorkerSnapshot], key: None) -> list[float]:
        u = self.unknown_score
        return [u if w.gpu_utilization is None else 1.0 - w.gpu_utilization for w in workers]

    def describe(self, worker: WorkerSnapshot, key: None) -> str:
        g = worker.gpu_utilization
        return "gpu=n/a" if g is None else f"gpu={g:.2f}"
