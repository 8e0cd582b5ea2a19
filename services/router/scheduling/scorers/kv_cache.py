"""``kv-cache``: prefer workers with free KV-cache memory.

    score = 1 - kv_cache_usage

Intent: a new sequence needs KV blocks for its prompt and every generated token; an engine
near a full cache preempts running sequences (recomputing or swapping them) instead of
admitting new ones, which stalls everyone. Free cache is capacity the slot count does not
show (long prompts fill the cache long before the batch is full).

Input: ``worker.kv_cache_usage`` (0..1). Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params
from services.router.scheduling.plugin import PluginContext, WorkerScorer
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class KvCacheScorer(WorkerScorer[None]):
    TYPE: ClassVar[str] = "kv-cache"

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls()

    def key(self, query: RouteQuery) -> None:
        return None

    def scores(self, workers: Sequence[WorkerSnapshot], key: None) -> list[float]:
        return [1.0 - w.kv_cache_usage for w in workers]

    def describe(self, worker: WorkerSnapshot, key: None) -> str:
        return f"kv={worker.kv_cache_usage:.2f}"
