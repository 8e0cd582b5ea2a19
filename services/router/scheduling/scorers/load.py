"""``load``: prefer the least loaded worker, by the shared load definition.

    score = 1 - load            (load = loadmodel.worker_load: tightest of slots and KV cache)

Intent: one number for "how full is it", the same one admission compares with its tier
thresholds. The default profile scores queue and KV cache separately (richer explanations);
this scorer is what the ``least-loaded`` baseline profile ranks by.

Input: ``running``, ``waiting``, ``in_flight``, ``max_running``, ``kv_cache_usage`` (and
``gpu_utilization`` with ``include_gpu``). Parameters: ``include_gpu`` (default false).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.loadmodel import describe_load, worker_load
from services.router.scheduling.params import Params
from services.router.scheduling.plugin import PluginContext, WorkerScorer
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadScorer(WorkerScorer[None]):
    TYPE: ClassVar[str] = "load"
    include_gpu: bool = False

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(include_gpu=params.boolean("include_gpu", False))

    def key(self, query: RouteQuery) -> None:
        return None

    def scores(self, workers: Sequence[WorkerSnapshot], key: None) -> list[float]:
        gpu = self.include_gpu
        return [1.0 - worker_load(w, gpu) for w in workers]

    def describe(self, worker: WorkerSnapshot, key: None) -> str:
        load = worker_load(worker, self.include_gpu)
        return f"load={load:.2f} ({describe_load(worker, self.include_gpu)})"
