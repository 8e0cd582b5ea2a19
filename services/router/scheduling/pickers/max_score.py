"""``max-score``: the best ``max_candidates`` by total score; ties broken at random.

Intent: the primary is the best worker now; the next ones are the edge's fallbacks if the
primary fails before the first token. Equal totals are ordered at random (``ranking.top_k``:
shuffle, then stable sort) so identical workers share a burst instead of the first one in
fleet order taking all of it.

``near_equal`` (default 0: off) widens "equal" for the primary: it is drawn uniformly from
every candidate whose total is within ``near_equal`` of the best. Against herding: many router
replicas (one per edge site) see the same stale load reports and would all send their next
requests to the one worker that looked best; totals that differ by less than a signal's noise
(a report's age, one token-rate sample) are not a reason to prefer one worker. Keep it below a
real difference — one batch slot of a small worker is worth ``queue weight / Σ weights / slots``
(0.06 on the default profile's 4-slot case), a region further away much more — so it spreads
among equivalent workers. With ``near_equal_across: false`` (the default) only candidates in
the best one's region are drawn from, so it never trades a near region for a far one (a
replica that is alone, with exact in-flight counts, loses nothing); ``true`` draws across
regions too. Nor does it give away a clear affinity: when the best one's boost from the
affinity scorers (``Scored.boosts``: a warm prefix, a live session) is itself at least
``near_equal`` — larger than the noise the band is for — only candidates with as much boost
are drawn from, so an agent's next call stays on the worker holding its KV cache while that
worker is not clearly busier (with the band alone, an idle fleet drew it away about one call in
eight, whenever the warm worker's last report still counted the previous call). Smaller boosts
(a short shared prefix) are drawn over like any other difference. Fallbacks follow by score.

The band is insurance against *other* routers' unseen picks, so it is drawn only when another
source sends to the region: some candidate there (anywhere, with ``near_equal_across``) is
``WorkerSnapshot.shared`` — its last admission list named a request this router did not make,
or it sends no such lists. A router that is every worker's only source counts each of its own
requests in flight exactly; its argmax cannot herd, and drawing would only give away a better
worker (routing_quality's single-router hotspot, simulated: TTFT p99 100 → 89 ms).

Input: the weighted totals (and the framework's shortlist of the best, when it has one).
Parameters: ``max_candidates`` (≥ 1, default 3), ``near_equal`` (0..1, default 0),
``near_equal_across`` (default false).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from itertools import compress, repeat
from typing import ClassVar, Self

from services.router.scheduling.params import Params, require
from services.router.scheduling.plugin import Picker, PluginContext, Scored
from services.router.scheduling.ranking import top_k
from services.router.scheduling.types import RouteQuery

_LE = operator.le
_EQ = operator.eq
_AND = operator.and_
_REGION = operator.attrgetter("region")
_SHARED = operator.attrgetter("shared")
# Affinity boosts within this of the best one's count as equal (float sums of the same shares).
_BOOST_SLACK = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class MaxScorePicker(Picker):
    TYPE: ClassVar[str] = "max-score"
    max_candidates: int = 3
    near_equal: float = 0.0
    near_equal_across: bool = False

    def __post_init__(self) -> None:
        require(self.max_candidates >= 1, "max_candidates", "must be >= 1")
        require(0.0 <= self.near_equal <= 1.0, "near_equal", "must be between 0 and 1")

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(
            max_candidates=params.integer("max_candidates", 3),
            near_equal=params.number("near_equal", 0.0),
            near_equal_across=params.boolean("near_equal_across", False),
        )

    def pick(self, query: RouteQuery, scored: Scored) -> tuple[int, ...]:
        k = self.max_candidates
        hint = scored.shortlist()
        shortlist = hint[0] if hint is not None and k <= hint[1] else None
        totals = scored.totals
        top = top_k(totals, k, scored.rng, shortlist)
        if self.near_equal <= 0.0 or len(top) < 2:
            return tuple(top)
        floor = totals[top[0]] - self.near_equal
        if totals[top[1]] < floor:
            return tuple(top)  # the best stands alone: the common case, decided in O(k)
        candidates = scored.candidates
        near = map(_LE, repeat(floor), totals)
        if self.near_equal_across:
            if not any(map(_SHARED, candidates)):
                return tuple(top)  # this router is every candidate's only source
        else:  # (C-level passes: this runs on most decisions)
            region = candidates[top[0]].region
            same = list(map(_EQ, map(_REGION, candidates), repeat(region)))
            if not any(compress(map(_SHARED, candidates), same)):
                return tuple(top)  # this router is the region's only source
            near = map(_AND, near, same)
        band = list(compress(range(len(totals)), near))
        held = scored.boosts.get(top[0], 0.0)
        if held >= self.near_equal:  # an affinity larger than the band is signal, not noise
            band = [i for i in band if scored.boosts.get(i, 0.0) >= held - _BOOST_SLACK]
        primary = band[int(scored.rng.random() * len(band))]
        rest = [i for i in top if i != primary]
        return (primary, *rest[: k - 1])
