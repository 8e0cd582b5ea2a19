"""Region pre-selection: choose a few regions from per-region aggregates, then run the
profile's worker-level filters, scorers and picker over those regions' workers only.

Why. A global fleet is ~100 regions of ~100 workers. The worker-level profile costs a few
microseconds per worker whose snapshot changed since the last decision of the same query
class, and at 10,000 workers with reports every few seconds that is thousands per second per
replica — most of a replica's CPU (docs/planet.md). Global load balancers choose
hierarchically: a region first, from a handful of numbers per region, then an endpoint
inside it. Here the first stage is deliberately coarse and conservative: it only *narrows*
the fleet to the ``max_regions`` best regions for this query, and the profile, unchanged,
decides among their workers, with its own explanation. When no worker of the chosen regions
survives the profile's filters, the decision is taken again over the whole fleet, so the
stage never refuses a request the profile would have served.

The region score, per region the query may use (residency, a ready worker serving the model):

    score = (latency_weight · tau / (tau + rtt) + capacity_weight · free / capacity)
            / (latency_weight + capacity_weight)

with ``rtt`` the region's nearest healthy worker's measured RTT (unknown: ``unknown_score``),
``capacity`` its healthy workers' batch slots and ``free`` the slots neither reported busy
(running + waiting) nor assigned by this router since (in flight). Regions with free slots
rank before full ones. Ties are broken at random. With ``near_equal`` > 0 the first region is
drawn, in proportion to free slots, among the regions with free slots that score within
``near_equal`` of the best (``RegionStage._draw`` says why: herding across replicas).

A view of the fleet that can answer per region (:class:`RegionalView`) is what makes this
cheap: the router's fleet keeps its rows grouped and their aggregates current as reports
arrive; the planet simulator's replicas build only the chosen regions' rows.

Profile YAML (optional; absent: the profile sees the whole fleet, as before)::

    regions: {max_regions: 3, tau_ms: 50, latency_weight: 1, capacity_weight: 1,
              unknown_score: 0.25, min_workers: 0, near_equal: 0}
"""

from __future__ import annotations

import heapq
import operator
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress, repeat
from typing import TYPE_CHECKING, NamedTuple, Protocol

from services.router.scheduling.incremental import changed_positions
from services.router.scheduling.params import ParamError, Params, check_positive, require
from services.router.scheduling.types import (
    Decision,
    ModelState,
    RouteQuery,
    WorkerSnapshot,
)

if TYPE_CHECKING:
    from services.router.scheduling.framework import SchedulerProfile


_WORKERS = operator.attrgetter("workers")
_IS_NOT = operator.is_not
_EQ = operator.eq
_UNRANKED = (False, 0.0)  # the key of a region that is not eligible (never read)


class RegionSummary(NamedTuple):
    """One region as this router sees it: enough to rank regions, nothing per worker.

    A named tuple (immutable, like the snapshots): a view builds one whenever a region's
    figures change, many per decision at planet scale, and a tuple is built ~3x faster than
    a frozen dataclass."""

    region: str
    workers: int  # listed
    healthy: int  # healthy and not draining
    capacity: int  # Σ max_running over the healthy ones
    busy: int  # Σ min(max_running, running + waiting + in_flight) over the healthy ones
    rtt_ms: float | None  # the nearest healthy worker's measured RTT (None: none measured)
    models: frozenset[str]  # models READY on at least one healthy worker

    @property
    def free(self) -> int:
        return self.capacity - self.busy


class RegionalView(Protocol):
    """A fleet that answers per region. ``rows`` returns the chosen regions' workers in a
    stable order, the same snapshot object for a worker until its state changes (the
    profile's incremental evaluation depends on it)."""

    def summaries(self) -> Sequence[RegionSummary]: ...

    def rows(self, regions: Sequence[str]) -> list[WorkerSnapshot]: ...

    def all_rows(self) -> list[WorkerSnapshot]: ...


def summarise(region: str, workers: Sequence[WorkerSnapshot]) -> RegionSummary:
    """The summary of one region's snapshots (what a view without its own aggregates uses)."""
    healthy = capacity = busy = 0
    rtt: float | None = None
    models: set[str] = set()
    for w in workers:
        if not w.healthy or w.draining:
            continue
        healthy += 1
        capacity += w.max_running
        busy += min(w.max_running, w.running + w.waiting + w.in_flight)
        if w.rtt_ms is not None and (rtt is None or w.rtt_ms < rtt):
            rtt = w.rtt_ms
        for m in w.models:
            if m.state is ModelState.READY:
                models.add(m.name)
    return RegionSummary(region, len(workers), healthy, capacity, busy, rtt, frozenset(models))


class RegionIndex:
    """A :class:`RegionalView` over the router's snapshot list, kept up to date
    incrementally: ``update(snapshots)`` finds the rows that changed since the last call
    (by identity, as the incremental evaluator does) and re-summarises only their regions.
    The router's service holds one beside its fleet; tests use it over inline lists."""

    __slots__ = ("_all", "_groups", "_summaries", "_where")

    def __init__(self) -> None:
        self._all: list[WorkerSnapshot] = []
        self._groups: dict[str, list[WorkerSnapshot]] = {}
        self._where: list[tuple[str, int]] = []  # input position → (region, index in group)
        self._summaries: dict[str, RegionSummary] = {}

    def update(self, workers: Sequence[WorkerSnapshot]) -> RegionIndex:
        new = list(workers)
        old = self._all
        touched: set[str] = set()
        regroup = len(new) != len(old)
        if not regroup:
            where, groups = self._where, self._groups
            for p in changed_positions(new, old):
                region, j = where[p]
                if new[p].region != region:
                    regroup = True
                    break
                groups[region][j] = new[p]
                touched.add(region)
        self._all = new
        if regroup:
            self._groups = {}
            self._where = []
            for w in new:
                group = self._groups.setdefault(w.region, [])
                self._where.append((w.region, len(group)))
                group.append(w)
            self._summaries = {r: summarise(r, ws) for r, ws in self._groups.items()}
        else:
            for region in touched:
                self._summaries[region] = summarise(region, self._groups[region])
        return self

    def summaries(self) -> list[RegionSummary]:
        return list(self._summaries.values())

    def rows(self, regions: Sequence[str]) -> list[WorkerSnapshot]:
        out: list[WorkerSnapshot] = []
        for r in regions:
            out.extend(self._groups.get(r, ()))
        return out

    def all_rows(self) -> list[WorkerSnapshot]:
        return self._all


@dataclass(frozen=True, slots=True, kw_only=True)
class RegionStage:
    """Ranks regions for a query and keeps the best ``max_regions``."""

    max_regions: int = 3
    tau_ms: float = 50.0
    latency_weight: float = 1.0
    capacity_weight: float = 1.0
    unknown_score: float = 0.25
    # Fleets smaller than this are decided whole: the stage is for scale, and on a handful of
    # workers it would only cost the ranked list its fallbacks in other regions.
    min_workers: int = 0
    # > 0: the first region is drawn, in proportion to free slots, among the regions with
    # free slots whose score is within this of the best (see ``select``); 0: the best.
    near_equal: float = 0.0
    # per query class (model, allowed regions): what select concluded about the last list
    _rankings: dict[tuple[str, frozenset[str]], _Ranking] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        require(self.max_regions >= 1, "max_regions", "must be >= 1")
        check_positive(self.tau_ms, "tau_ms")
        require(self.latency_weight >= 0, "latency_weight", "must be >= 0")
        require(self.capacity_weight >= 0, "capacity_weight", "must be >= 0")
        require(
            self.latency_weight + self.capacity_weight > 0,
            "capacity_weight",
            "latency_weight + capacity_weight must be > 0",
        )
        require(0.0 <= self.unknown_score <= 1.0, "unknown_score", "must be between 0 and 1")
        require(self.min_workers >= 0, "min_workers", "must be >= 0")
        require(0.0 <= self.near_equal <= 1.0, "near_equal", "must be between 0 and 1")

    @classmethod
    def from_params(cls, params: Params) -> RegionStage:
        stage = cls(
            max_regions=params.integer("max_regions", 3),
            tau_ms=params.number("tau_ms", 50.0),
            latency_weight=params.number("latency_weight", 1.0),
            capacity_weight=params.number("capacity_weight", 1.0),
            unknown_score=params.number("unknown_score", 0.25),
            min_workers=params.integer("min_workers", 0),
            near_equal=params.number("near_equal", 0.0),
        )
        params.finish()
        return stage

    def select(
        self, query: RouteQuery, summaries: Sequence[RegionSummary], rng: random.Random
    ) -> tuple[tuple[str, ...], int]:
        """The chosen regions, best first, and how many regions were eligible.

        Ranked by (has free slots, score), ties broken by a random rotation of the eligible
        list. This runs on every decision over ~100 regions, most of which have not changed
        since the last one (a view hands in the same summary object until its region
        changes). So, per query class, the eligibility and key of each position are kept
        and recomputed only where the object differs (found in one C-level pass); the rest
        — the eligible list, the best key and who ties with it — are C-level passes too. With
        one region to choose (the default) the rotation is applied to the tied regions only:
        the same choice as ranking every region's full key."""
        allowed = query.allowed_regions
        model = query.model
        n_all = len(summaries)
        memo = self._rankings.get((model, allowed))
        changed: Iterable[int]
        if memo is None or len(memo.rows) != n_all:
            if len(self._rankings) >= 64:
                self._rankings.clear()
            memo = _Ranking(list(summaries), [False] * n_all, [_UNRANKED] * n_all)
            self._rankings[(model, allowed)] = memo
            changed = range(n_all)
        else:
            changed = list(compress(range(n_all), map(_IS_NOT, summaries, memo.rows)))
        rows, eligible, keys = memo.rows, memo.eligible, memo.keys
        # The region score of the module docstring, computed here and nowhere else, inline:
        # ~20 changed regions per decision at planet scale, and a method call and a property
        # each were a third of this loop.
        tau, unknown = self.tau_ms, self.unknown_score
        lw, cw = self.latency_weight, self.capacity_weight
        lcw = lw + cw
        for i in changed:  # eligible: residency, healthy, the model ready
            s = summaries[i]
            rows[i] = s
            region, _, healthy, capacity, busy, rtt, models = s
            if healthy and model in models and (not allowed or region in allowed):
                eligible[i] = True
                free = capacity - busy
                lat = unknown if rtt is None else tau / (tau + (rtt if rtt > 0.0 else 0.0))
                cap = (free if free > 0 else 0) / capacity if capacity > 0 else 0.0
                keys[i] = (free > 0, (lw * lat + cw * cap) / lcw)
            else:
                eligible[i] = False
                keys[i] = _UNRANKED
        idx = list(compress(range(n_all), eligible))
        n = len(idx)
        if n <= self.max_regions:
            return tuple(summaries[i].region for i in idx), n
        flags = list(compress(keys, eligible))
        drawn = self._draw(summaries, idx, flags, rng) if self.near_equal > 0.0 else None
        if drawn is not None and self.max_regions == 1:
            return (summaries[drawn].region,), n
        off = rng.randrange(n)
        if self.max_regions == 1:
            tied = compress(range(n), map(_EQ, flags, repeat(max(flags))))
            j = max(tied, key=lambda j: (j - off) % n)
            return (summaries[idx[j]].region,), n
        ranked = [(*flags[j], (j - off) % n, i) for j, i in enumerate(idx) if i != drawn]
        top = heapq.nlargest(self.max_regions - (drawn is not None), ranked)
        rest = tuple(summaries[t[3]].region for t in top)
        return (rest if drawn is None else (summaries[drawn].region, *rest)), n

    def _draw(
        self,
        summaries: Sequence[RegionSummary],
        idx: Sequence[int],
        keys: Sequence[tuple[bool, float]],
        rng: random.Random,
    ) -> int | None:
        """The first region, drawn in proportion to free slots among the regions with free
        slots that score within ``near_equal`` of the best; None when none has free slots.

        Why. Every replica ranks the same (equally stale) summaries, so the argmax is the
        same region everywhere: each replica counts its own requests in flight there, but
        not the others', and a region that looked roomy takes several replicas' bursts at
        once (planet-1k: the Indian sites' overflow, filling one region after another). A
        draw in proportion to free slots sends each region a share of the herd as large as
        its room (the randomisation that makes stale load information safe: Mitzenmacher,
        "How useful is old information?", 2000), while a region clearly nearer or emptier
        than the others (a score gap over ``near_equal``) still takes all of it."""
        best = max(keys)
        if not best[0]:
            return None
        floor = best[1] - self.near_equal
        pool = [i for j, i in enumerate(idx) if keys[j][0] and keys[j][1] >= floor]
        if len(pool) == 1:
            return pool[0]
        weights = [summaries[i].free for i in pool]
        x = rng.random() * sum(weights)
        for i, wgt in zip(pool, weights, strict=True):
            x -= wgt
            if x < 0.0:
                return i
        return pool[-1]


class _Ranking:
    """``RegionStage.select``'s memo for one query class: the summaries it last saw, by
    position, whether each was eligible, and its rank key. Holding the summaries keeps the
    identity comparison sound (an object cannot be freed and its id reused meanwhile)."""

    __slots__ = ("eligible", "keys", "rows")

    def __init__(
        self, rows: list[RegionSummary], eligible: list[bool], keys: list[tuple[bool, float]]
    ) -> None:
        self.rows = rows
        self.eligible = eligible
        self.keys = keys


def read_stage(raw: object) -> RegionStage:
    """The ``regions`` section of a profile (``ParamError`` names the bad key)."""
    if not isinstance(raw, Mapping):
        raise ParamError("", "must be a mapping (e.g. {max_regions: 3})")
    return RegionStage.from_params(Params(raw))


def schedule_regions(
    profile: SchedulerProfile,
    stage: RegionStage,
    query: RouteQuery,
    view: RegionalView,
    *,
    explain: bool = True,
) -> Decision:
    """Pre-select regions, then decide with the profile over their workers (the decision
    over the whole fleet when none of theirs survives the filters). ``explain``: as in
    ``SchedulerProfile.schedule`` (without it, no note of the regions either)."""
    summaries = view.summaries()
    if stage.min_workers and sum(map(_WORKERS, summaries)) < stage.min_workers:
        return profile.schedule(query, view.all_rows(), explain=explain)
    chosen, eligible = stage.select(query, summaries, profile.rng)
    if not chosen or len(chosen) >= eligible:
        return profile.schedule(query, view.all_rows(), explain=explain)
    # The same regions in any order are the same part of the fleet: one memo for them.
    scope: tuple[str, ...] = tuple(sorted(chosen))
    decision = profile.schedule(query, view.rows(scope), scope=scope, explain=explain)
    if decision.ranked:
        if not explain:
            return decision
        note = f" [regions: {', '.join(chosen)} of {eligible}]"
        return replace(decision, explanation=decision.explanation + note)
    return profile.schedule(query, view.all_rows(), explain=explain)
