"""``power-of-two``: sample ``choices`` candidates uniformly at random, rank them by total.

    sample d = choices candidates without replacement; ranked = those d by total, best first
    (ties at random); fallbacks beyond d: further random candidates

Intent: the power-of-d-choices load balancer (Mitzenmacher, "The Power of Two Choices in
Randomized Load Balancing", 2001): with d = 2 the maximum queue length falls from
log n / log log n to log log n, with no global view and no herding — a standard baseline for
distributed schedulers (and a benchmark baseline here, with the ``load`` scorer).
Input: the weighted totals. Parameters: ``choices`` (≥ 1, default 2), ``max_candidates``
(≥ 1, default 3). O(d + max_candidates) per decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params, require
from services.router.scheduling.plugin import Picker, PluginContext, Scored
from services.router.scheduling.types import RouteQuery


@dataclass(frozen=True, slots=True, kw_only=True)
class PowerOfTwoPicker(Picker):
    TYPE: ClassVar[str] = "power-of-two"
    choices: int = 2
    max_candidates: int = 3

    def __post_init__(self) -> None:
        require(self.choices >= 1, "choices", "must be >= 1")
        require(self.max_candidates >= 1, "max_candidates", "must be >= 1")

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(
            choices=params.integer("choices", 2),
            max_candidates=params.integer("max_candidates", 3),
        )

    def pick(self, query: RouteQuery, scored: Scored) -> tuple[int, ...]:
        n = len(scored.candidates)
        if n == 0:
            return ()
        rng = scored.rng
        drawn = rng.sample(range(n), min(n, max(self.choices, self.max_candidates)))
        head = drawn[: self.choices]
        totals = scored.totals
        rng.shuffle(head)
        head.sort(key=totals.__getitem__, reverse=True)
        return tuple((head + drawn[self.choices :])[: self.max_candidates])
