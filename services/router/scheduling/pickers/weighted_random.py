"""``weighted-random``: sample ``max_candidates`` without replacement, with probability
proportional to ``total ** power``.

    key_i = u_i ** (1 / weight_i),  u_i ~ U(0, 1);  ranked = top keys   (Efraimidis-Spirakis)

Intent: several router replicas watching the same workers each see the same "best" worker
between load reports; sampling by score spreads their picks in proportion to quality instead
of herding (GIE's weighted-random picker). ``power`` sharpens (> 1) or flattens (< 1) the
preference; 0 is uniform. Candidates whose total is 0 come last, in random order.

Input: the weighted totals. Parameters: ``max_candidates`` (≥ 1, default 3), ``power``
(≥ 0, default 1.0). O(n) Python per decision: for profiles with few workers or as a baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params, require
from services.router.scheduling.plugin import Picker, PluginContext, Scored
from services.router.scheduling.ranking import top_k
from services.router.scheduling.types import RouteQuery


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightedRandomPicker(Picker):
    TYPE: ClassVar[str] = "weighted-random"
    max_candidates: int = 3
    power: float = 1.0

    def __post_init__(self) -> None:
        require(self.max_candidates >= 1, "max_candidates", "must be >= 1")
        require(math.isfinite(self.power) and self.power >= 0, "power", "must be >= 0")

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(
            max_candidates=params.integer("max_candidates", 3),
            power=params.number("power", 1.0),
        )

    def pick(self, query: RouteQuery, scored: Scored) -> tuple[int, ...]:
        rnd = scored.rng.random
        p = self.power
        keys = [rnd() ** (1.0 / (t**p)) if t > 0.0 else 0.0 for t in scored.totals]
        return tuple(top_k(keys, self.max_candidates, scored.rng))
