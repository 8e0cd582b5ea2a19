"""``region-proximity``: prefer the client's own region (and its neighbours).

    score = 1               worker.region == client_region
          = neighbor_score  worker.region is listed as a neighbour of client_region
          = 0               otherwise, and for every worker when the client region is unknown

Intent: the router measures RTT from its own site; when the edge knows the client sits
elsewhere (roaming, anycast landing far away), this keeps processing close to the user and
within expected jurisdictions. A coarse, policy-shaped signal: weight it lightly.

Input: ``query.client_region``, ``worker.region``. Parameters: ``neighbors``
(``{region: [regions]}``, symmetric is not assumed), ``neighbor_score`` (0..1, default 0.5).
Memoised per client region.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Self

from services.router.scheduling.params import Params, check_unit
from services.router.scheduling.plugin import PluginContext, WorkerScorer
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class RegionProximityScorer(WorkerScorer[str]):
    TYPE: ClassVar[str] = "region-proximity"
    neighbors: Mapping[str, frozenset[str]] = field(default_factory=dict)
    neighbor_score: float = 0.5

    def __post_init__(self) -> None:
        check_unit(self.neighbor_score, "neighbor_score")
        frozen = {k: frozenset(v) for k, v in self.neighbors.items()}
        object.__setattr__(self, "neighbors", MappingProxyType(frozen))

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        section = params.section("neighbors")
        neighbors = {r: frozenset(section.strings(r)) for r in section.names()}
        return cls(neighbors=neighbors, neighbor_score=params.number("neighbor_score", 0.5))

    def key(self, query: RouteQuery) -> str:
        return query.client_region

    def scores(self, workers: Sequence[WorkerSnapshot], key: str) -> list[float]:
        if not key:
            return [0.0] * len(workers)
        near = self.neighbors.get(key, frozenset())
        ns = self.neighbor_score
        return [1.0 if w.region == key else ns if w.region in near else 0.0 for w in workers]

    def describe(self, worker: WorkerSnapshot, key: str) -> str:
        return f"client={key or 'unknown'} worker={worker.region}"
