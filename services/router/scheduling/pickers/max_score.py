"""``max-score``: the best ``max_candidates`` by total score; ties broken at random.

Intent: the primary is the best worker now; the next ones are the edge's fallbacks if the
primary fails before the first token. Equal totals are ordered at random (``ranking.top_k``:
shuffle, then stable sort) so identical workers share a burst instead of the first one in
fleet order taking all of it.

Input: the weighted totals (and the framework's shortlist of the best, when it has one).
Parameters: ``max_candidates`` (≥ 1, default 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params, require
from services.router.scheduling.plugin import Picker, PluginContext, Scored
from services.router.scheduling.ranking import top_k
from services.router.scheduling.types import RouteQuery


@dataclass(frozen=True, slots=True, kw_only=True)
class MaxScorePicker(Picker):
    TYPE: ClassVar[str] = "max-score"
    max_candidates: int = 3

    def __post_init__(self) -> None:
        require(self.max_candidates >= 1, "max_candidates", "must be >= 1")

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(max_candidates=params.integer("max_candidates", 3))

    def pick(self, query: RouteQuery, scored: Scored) -> tuple[int, ...]:
        k = self.max_candidates
        hint = scored.shortlist()
        shortlist = hint[0] if hint is not None and k <= hint[1] else None
        return tuple(top_k(scored.totals, k, scored.rng, shortlist))
