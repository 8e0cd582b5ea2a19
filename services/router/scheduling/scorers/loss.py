"""``loss``: prefer network paths that do not drop packets.

    score = 1 - loss / max_loss        (clamped to 0 from max_loss up)

Intent: packet loss turns into TCP retransmissions, i.e. stalls in the token stream that RTT
alone does not show. A path losing ``max_loss`` or more is as bad as it gets.

Input: ``worker.loss`` (share of this router's probes lost, recent window, 0..1).
Parameters: ``max_loss`` (0 < max_loss ≤ 1, default 0.05).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params, require
from services.router.scheduling.plugin import PluginContext, WorkerScorer
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class LossScorer(WorkerScorer[None]):
    TYPE: ClassVar[str] = "loss"
    max_loss: float = 0.05

    def __post_init__(self) -> None:
        ok = math.isfinite(self.max_loss) and 0 < self.max_loss <= 1
        require(ok, "max_loss", "must be > 0 and <= 1")

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(max_loss=params.number("max_loss", 0.05))

    def key(self, query: RouteQuery) -> None:
        return None

    def scores(self, workers: Sequence[WorkerSnapshot], key: None) -> list[float]:
        m = self.max_loss
        return [1.0 - w.loss / m for w in workers]

    def describe(self, worker: WorkerSnapshot, key: None) -> str:
        return f"loss={worker.loss * 100:.1f}%"
