"""``admission``: saturation and priority tiers — who may still be admitted to a busy worker.

Intent: shed the lowest priority first. A worker whose load (``loadmodel.worker_load``: the
tightest of batch slots incl. queued and in-flight requests, and KV cache) has reached a tier's
threshold refuses that tier; with the defaults a worker at ≥ 0.95 refuses LOW, at ≥ 0.98
refuses STANDARD, and HIGH is admitted until hard capacity (1.0: every batch slot taken or the
KV cache full). When every allowed worker refuses, the decision is SATURATED and the client is
told to retry after ``retry_after_s`` (RESOURCE_EXHAUSTED / HTTP 503 with Retry-After).

Input: ``query.priority``, ``worker.region`` and the worker's load. Parameters:

- ``thresholds``: ``{low, standard, high}``, each > 0, low ≤ standard ≤ high
  (defaults 0.95, 0.98, 1.0);
- ``regions``: per-region overrides, ``{region: {low?, standard?, high?}}`` — a tier left out
  inherits the global threshold (per-region limits from policy);
- ``include_gpu``: fold GPU utilisation into the load (default false; see ``loadmodel``);
- ``retry_after_s``: retry hint when this filter empties a decision (≥ 0, default 1.0).

Memoised per priority tier.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Self

from services.router.scheduling.loadmodel import describe_load, worker_load
from services.router.scheduling.params import ParamError, Params, require
from services.router.scheduling.plugin import PluginContext, WorkerFilter
from services.router.scheduling.types import NoCandidate, Priority, RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class TierThresholds:
    """Load at which a worker refuses each priority tier."""

    low: float = 0.95
    standard: float = 0.98
    high: float = 1.0

    def __post_init__(self) -> None:
        for name in ("low", "standard", "high"):
            value = getattr(self, name)
            require(math.isfinite(value) and value > 0, name, "must be > 0")
        require(
            self.low <= self.standard <= self.high,
            "",
            f"must satisfy low <= standard <= high (got {self.low:g}, {self.standard:g}, "
            f"{self.high:g}): the lowest tier is shed first",
        )

    def of(self, priority: Priority) -> float:
        if priority is Priority.HIGH:
            return self.high
        return self.low if priority is Priority.LOW else self.standard

    @classmethod
    def read(cls, section: Params, base: TierThresholds) -> TierThresholds:
        try:
            return cls(
                low=section.number("low", base.low),
                standard=section.number("standard", base.standard),
                high=section.number("high", base.high),
            )
        except ParamError as err:
            raise ParamError(section.path(err.path), err.message) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionFilter(WorkerFilter[Priority]):
    TYPE: ClassVar[str] = "admission"
    EMPTY_REASON: ClassVar[NoCandidate | None] = NoCandidate.SATURATED

    thresholds: TierThresholds = TierThresholds()
    regions: Mapping[str, TierThresholds] = field(default_factory=dict)
    include_gpu: bool = False
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        require(
            math.isfinite(self.retry_after_s) and self.retry_after_s >= 0,
            "retry_after_s",
            "must be >= 0",
        )
        object.__setattr__(self, "regions", MappingProxyType(dict(self.regions)))

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        base = TierThresholds.read(params.section("thresholds"), TierThresholds())
        regions_section = params.section("regions")
        regions = {
            region: TierThresholds.read(regions_section.section(region), base)
            for region in regions_section.names()
        }
        return cls(
            thresholds=base,
            regions=regions,
            include_gpu=params.boolean("include_gpu", False),
            retry_after_s=params.number("retry_after_s", 1.0),
        )

    def retry_hint_s(self) -> float | None:
        return self.retry_after_s

    def key(self, query: RouteQuery) -> Priority:
        return query.priority

    def reject(self, workers: Sequence[WorkerSnapshot], key: Priority) -> list[str | None]:
        default = self.thresholds.of(key)
        limits = {region: t.of(key) for region, t in self.regions.items()}
        gpu = self.include_gpu
        out: list[str | None] = []
        for w in workers:
            limit = limits.get(w.region, default) if limits else default
            load = worker_load(w, gpu)
            out.append(None if load < limit else self._reason(w, key, load, limit))
        return out

    def _reason(self, w: WorkerSnapshot, priority: Priority, load: float, limit: float) -> str:
        inputs = describe_load(w, self.include_gpu)
        return f"refuses {priority.name} at load {load:.2f} >= {limit:g} ({inputs})"
