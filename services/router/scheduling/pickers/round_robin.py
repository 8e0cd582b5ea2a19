"""``round-robin``: ignore scores and rotate through the candidates (a benchmark baseline).

Intent: what a plain load balancer does; the comparison point that shows what the signals
buy. The rotation is by position in the candidate list (Envoy's round robin over healthy
hosts), so it is exact while the worker set is stable.

Input: the candidate list only. Parameters: ``max_candidates`` (≥ 1, default 3). Stateful (a
counter), hence one instance per scheduler.
"""

from __future__ import annotations

from typing import ClassVar, Self

from services.router.scheduling.params import Params, require
from services.router.scheduling.plugin import Picker, PluginContext, Scored
from services.router.scheduling.types import RouteQuery


class RoundRobinPicker(Picker):
    TYPE: ClassVar[str] = "round-robin"
    __slots__ = ("_next", "max_candidates")

    def __init__(self, *, max_candidates: int = 3) -> None:
        require(max_candidates >= 1, "max_candidates", "must be >= 1")
        self.max_candidates = max_candidates
        self._next = 0

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(max_candidates=params.integer("max_candidates", 3))

    def pick(self, query: RouteQuery, scored: Scored) -> tuple[int, ...]:
        n = len(scored.candidates)
        if n == 0:
            return ()
        start = self._next % n
        self._next = start + 1
        return tuple((start + j) % n for j in range(min(self.max_candidates, n)))
