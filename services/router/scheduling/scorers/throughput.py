"""``throughput``: prefer workers where a new stream will decode fast.

    per_stream = tokens_per_second / running
    score      = min(1, per_stream / target_tokens_per_s)
               = 1              when nothing is running (all headroom)
               = unknown_score  when streams run but no rate is reported yet

Intent: throughput headroom as the user feels it. A batch shares the GPU, so as a worker
fills up each stream decodes more slowly (inter-token latency grows) long before the batch
is full; a worker whose streams still get ``target_tokens_per_s`` each has headroom. It also
tells apart hardware of different speed at equal occupancy.

Input: ``tokens_per_second`` (generated, recent window), ``running``. Parameters:
``target_tokens_per_s`` (> 0, default 30: the per-stream rate that counts as unhindered),
``unknown_score`` (0..1, default 0.5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params, check_positive, check_unit
from services.router.scheduling.plugin import PluginContext, WorkerScorer
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputScorer(WorkerScorer[None]):
    TYPE: ClassVar[str] = "throughput"
    target_tokens_per_s: float = 30.0
    unknown_score: float = 0.5

    def __post_init__(self) -> None:
        check_positive(self.target_tokens_per_s, "target_tokens_per_s")
        check_unit(self.unknown_score, "unknown_score")

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(
            target_tokens_per_s=params.number("target_tokens_per_s", 30.0),
            unknown_score=params.number("unknown_score", 0.5),
        )

    def key(self, query: RouteQuery) -> None:
        return None

    def scores(self, workers: Sequence[WorkerSnapshot], key: None) -> list[float]:
        target, unknown = self.target_tokens_per_s, self.unknown_score
        return [
            1.0
            if w.running <= 0
            else unknown
            if w.tokens_per_second <= 0
            else w.tokens_per_second / (w.running * target)
            for w in workers
        ]

    def describe(self, worker: WorkerSnapshot, key: None) -> str:
        w = worker
        if w.running <= 0:
            return "idle"
        per_stream = w.tokens_per_second / w.running
        return f"tps={w.tokens_per_second:.0f}/{w.running} streams ({per_stream:.1f}/stream)"
