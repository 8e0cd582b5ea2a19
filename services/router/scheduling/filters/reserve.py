"""``tier-reserve``: keep the last batch slots of every worker for the tiers above.

    free(w)   = max_running − (running + waiting + in_flight)
    rejects w for tier T   when free(w) <= reserve[T]

Intent: ``admission`` sheds by load *fraction*, which on a small batch reserves nothing — with
8 slots, LOW at its 0.95 threshold is admitted at 7 of 8 and takes the last slot, so a LOW
flood leaves HIGH nothing (the planet simulator showed it: tests/unit/planet/test_sim.py).
Counting slots instead keeps ``reserve[T]`` slots free of tier T and below on every worker,
whatever its batch size. When every allowed worker refuses, the decision is SATURATED, as with
admission (RESOURCE_EXHAUSTED, Retry-After).
Input: ``query.priority``, the worker's slot counts. Parameters: ``reserve``
``{low, standard, high}`` (slots, integers ≥ 0, low ≥ standard ≥ high; defaults 2, 1, 0),
``retry_after_s`` (≥ 0, default 1.0). Memoised per priority tier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params, require
from services.router.scheduling.plugin import PluginContext, WorkerFilter
from services.router.scheduling.types import NoCandidate, Priority, RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class TierReserveFilter(WorkerFilter[Priority]):
    TYPE: ClassVar[str] = "tier-reserve"
    EMPTY_REASON: ClassVar[NoCandidate | None] = NoCandidate.SATURATED
    low: int = 2
    standard: int = 1
    high: int = 0
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("low", "standard", "high"):
            require(getattr(self, name) >= 0, f"reserve.{name}", "must be >= 0")
        require(
            self.low >= self.standard >= self.high,
            "reserve",
            "must satisfy low >= standard >= high: a lower tier never has more room",
        )
        require(
            math.isfinite(self.retry_after_s) and self.retry_after_s >= 0,
            "retry_after_s",
            "must be >= 0",
        )

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        reserve = params.section("reserve")
        return cls(
            low=reserve.integer("low", 2),
            standard=reserve.integer("standard", 1),
            high=reserve.integer("high", 0),
            retry_after_s=params.number("retry_after_s", 1.0),
        )

    def retry_hint_s(self) -> float | None:
        return self.retry_after_s

    def key(self, query: RouteQuery) -> Priority:
        return query.priority

    def reject(self, workers: Sequence[WorkerSnapshot], key: Priority) -> list[str | None]:
        high, low = key is Priority.HIGH, key is Priority.LOW
        keep = self.high if high else self.low if low else self.standard
        out: list[str | None] = []
        for w in workers:
            free = w.max_running - (w.running + w.waiting + w.in_flight)
            out.append(
                None
                if free > keep
                else f"keeps its last {keep} slot(s) for tiers above {key.name} "
                f"(slots={w.running}+{w.waiting}+{w.in_flight}/{w.max_running})"
            )
        return out
