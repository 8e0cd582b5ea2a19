"""``latency``: prefer workers this router reaches quickly.

    score = 1 / (1 + rtt_ms / tau_ms) = tau_ms / (tau_ms + rtt_ms)

Intent: network round-trip time from this router's site (one replica runs beside each edge
site, so it is the edge's view) is paid by the first token and, over a stream, by every
chunk. The hyperbola keeps differences between near workers visible (2 ms → 0.96, 20 ms →
0.71 with tau 50 ms) while far ones fade smoothly (60 ms → 0.45, 150 ms → 0.25) instead of
hitting a cliff at a configured maximum.

Unknown RTT (not probed yet) scores ``unknown_score``: penalised, not excluded — 0.25 by
default, as if it were 3·tau (150 ms) away, so a worker that has just joined gets traffic only
when measured ones are worse.

Input: ``worker.rtt_ms`` (the minimum probe RTT over a short window, ms; ``None`` unknown).
Parameters: ``tau_ms`` (> 0, default 50: the RTT that halves the score), ``unknown_score``
(0..1, default 0.25).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params, check_positive, check_unit
from services.router.scheduling.plugin import PluginContext, WorkerScorer
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencyScorer(WorkerScorer[None]):
    TYPE: ClassVar[str] = "latency"
    tau_ms: float = 50.0
    unknown_score: float = 0.25

    def __post_init__(self) -> None:
        check_positive(self.tau_ms, "tau_ms")
        check_unit(self.unknown_score, "unknown_score")

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(
            tau_ms=params.number("tau_ms", 50.0),
            unknown_score=params.number("unknown_score", 0.25),
        )

    def key(self, query: RouteQuery) -> None:
        return None

    def scores(self, workers: Sequence[WorkerSnapshot], key: None) -> list[float]:
        tau, unknown = self.tau_ms, self.unknown_score
        return [
            unknown if (r := w.rtt_ms) is None else tau / (tau + r) if r > 0.0 else 1.0
            for w in workers
        ]

    def describe(self, worker: WorkerSnapshot, key: None) -> str:
        return "rtt=unknown" if worker.rtt_ms is None else f"rtt={worker.rtt_ms:.1f}ms"
