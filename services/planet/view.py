"""One router replica's view of the fleet: what the real registry would hold at this edge site,
built from what has *arrived here* by now.

Information delay is the point. A worker's load report leaves it at ``sent_at`` and reaches
site ``s`` one one-way delay later; this view applies it only then, so a replica in São Paulo
sees Tokyo's workers as they were ~130 ms ago (plus up to one report interval), and two
replicas deciding at the same instant see different pasts. Same for everything else the
registry learns: a crashed worker's broken stream (one-way later), a partitioned one going
stale (``stale_after`` after its last report arrived), RTT and loss changes (after the probes
that measure them), outcome reports from this site's edge (at once: it sits beside it).

Reports travel in shared per-region logs (one append per report, not one per replica); each
replica keeps a cursor per region and, when it decides, applies the entries whose arrival time
has passed. Rows are rebuilt only when something about them changed, and the rest keep their
``WorkerSnapshot`` object, as the registry does — so the scheduler's incremental evaluation
works here exactly as in the router.

The registry semantics mirrored (``services/router/fleet.py``): a report names the decision
ids the worker admitted since the previous one, and those stop counting as in flight; an
outcome ends an assignment; failed outcomes count as ``recent_failures`` for 30 s; a worker is
healthy while its stream is connected and reports are fresh. Not mirrored: ``report_age_s``
ticking between identical reports (only the ``fresh-report`` filter reads it, and staleness is
modelled as health instead), per-stream report phases (one phase per worker, shared by all
replicas).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from services.router.scheduling.regional import RegionSummary
from services.router.scheduling.types import ModelState, ModelStatus, WorkerSnapshot

FAILURE_WINDOW_S = 30.0


@dataclass(frozen=True, slots=True)
class Report:
    sent_at: float
    running: int
    waiting: int
    kv: float
    tps: float
    hit_rate: float
    gpu: float
    models: tuple[ModelStatus, ...]
    draining: bool
    admitted: tuple[int, ...]


class RegionLog:
    """Reports sent by one region's workers, in send order: ``(sent_at, worker, report)``."""

    __slots__ = ("base", "entries")

    def __init__(self) -> None:
        self.entries: list[tuple[float, int, Report]] = []
        self.base = 0  # absolute index of entries[0]

    def trim(self, upto: int) -> None:
        cut = upto - self.base
        if cut > 0:
            del self.entries[:cut]
            self.base = upto


@dataclass(frozen=True, slots=True)
class StaticWorker:
    worker_id: str
    region: str
    region_index: int
    address: str
    max_running: int


class SiteView:
    """One replica's registry, and a :class:`~services.router.scheduling.regional.RegionalView`
    of it: region summaries kept current from what changed (O(1) per changed worker), and rows
    (``WorkerSnapshot``) built only when a decision asks for their region — so a profile with
    region pre-selection costs what its chosen regions cost, not what the planet does."""

    __slots__ = (
        "_agg",
        "_contrib",
        "_dirty",
        "_is_dirty",
        "_pending",
        "_region_of",
        "_region_rows",
        "_region_workers",
        "_rows",
        "_seq",
        "_slot",
        "_stale",
        "_summaries",
        "assigned",
        "cursors",
        "failures",
        "health",
        "loss",
        "owd_s",
        "reports",
        "rtt_ms",
        "site",
        "workers",
    )

    def __init__(
        self,
        site: str,
        workers: Sequence[StaticWorker],
        rtt_ms: Sequence[float],
        loss: Sequence[float],
        initial: Sequence[Report],
    ) -> None:
        self.site = site
        self.workers = workers
        regions = max(w.region_index for w in workers) + 1
        self.rtt_ms = list(rtt_ms)  # per region, as this site's probes measure it
        self.loss = list(loss)
        self.owd_s = [r / 2000.0 for r in rtt_ms]
        self.reports = list(initial)
        self.assigned: list[dict[int, None]] = [{} for _ in workers]
        self.failures: list[deque[float]] = [deque() for _ in workers]
        self.health: list[tuple[bool, str]] = [(True, "ok")] * len(workers)
        self.cursors = [0] * regions
        self._pending: list[tuple[float, int, int, int, object]] = []
        self._seq = itertools.count()
        self._dirty: list[int] = []
        self._is_dirty = [False] * len(workers)
        self._rows = [self._build(i) for i in range(len(workers))]
        # Per region: its workers, their rows (aligned), the rows to rebuild before use.
        self._region_of: dict[str, int] = {}
        self._region_workers: list[list[int]] = [[] for _ in range(regions)]
        self._slot = [0] * len(workers)
        for i, sw in enumerate(workers):
            self._region_of.setdefault(sw.region, sw.region_index)
            self._slot[i] = len(self._region_workers[sw.region_index])
            self._region_workers[sw.region_index].append(i)
        self._region_rows = [[self._rows[i] for i in ws] for ws in self._region_workers]
        self._stale: list[list[int]] = [[] for _ in range(regions)]
        # Region aggregates: [healthy, capacity, busy, {ready model: workers}] and each
        # worker's part in them; summaries rebuilt when their region's aggregate moved.
        self._agg: list[list[Any]] = [[0, 0, 0, {}] for _ in range(regions)]
        self._contrib: list[tuple[int, int, int, tuple[str, ...]]] = [(0, 0, 0, ())] * len(workers)
        self._summaries: list[RegionSummary | None] = [None] * regions
        for i in range(len(workers)):
            self._account(i)

    # --- inputs (timestamped with when they reach this site) ------------------------------

    def later(self, at: float, kind: int, worker: int, payload: object = None) -> None:
        """Something this replica learns at ``at``: OUTCOME (payload (rid, failed)), HEALTH
        (payload (healthy, detail)), LINK (worker = region index, payload (rtt_ms, loss))."""
        heapq.heappush(self._pending, (at, next(self._seq), kind, worker, payload))

    def assign(self, worker: int, rid: int) -> None:
        self.assigned[worker][rid] = None
        self._touch(worker)

    # --- sync ----------------------------------------------------------------------------

    def sync(self, now: float, logs: Sequence[RegionLog]) -> list[WorkerSnapshot]:
        """Apply everything that has reached this site by ``now``; every row, current."""
        self.advance(now, logs)
        return self.all_rows()

    def advance(self, now: float, logs: Sequence[RegionLog]) -> None:
        """Apply everything that has reached this site by ``now`` (rows are built when a
        decision asks for them: :meth:`rows`, :meth:`all_rows`)."""
        owd = self.owd_s
        cursors = self.cursors
        reports = self.reports
        assigned = self.assigned
        touch = self._touch
        for g, log in enumerate(logs):
            c = cursors[g]
            entries = log.entries
            i = c - log.base
            if i >= len(entries):
                continue
            horizon = now - owd[g]
            n = len(entries)
            while i < n and entries[i][0] <= horizon:
                _, w, rep = entries[i]
                reports[w] = rep
                if rep.admitted:
                    mine = assigned[w]
                    if mine:
                        for rid in rep.admitted:
                            mine.pop(rid, None)
                touch(w)
                i += 1
            cursors[g] = i + log.base
        pending = self._pending
        while pending and pending[0][0] <= now:
            at, _, kind, w, payload = heapq.heappop(pending)
            self._apply(at, kind, w, payload)
        if self._dirty:
            is_dirty = self._is_dirty
            stale = self._stale
            workers = self.workers
            account = self._account
            for w in self._dirty:
                is_dirty[w] = False
                account(w)
                stale[workers[w].region_index].append(w)
            self._dirty = []

    # --- the RegionalView the router's region stage reads --------------------------------

    def _account(self, w: int) -> None:
        """Move worker ``w``'s part of its region's aggregate to its current state."""
        sw = self.workers[w]
        rep = self.reports[w]
        if self.health[w][0] and not rep.draining:
            cap = sw.max_running
            part = (
                1,
                cap,
                min(cap, rep.running + rep.waiting + len(self.assigned[w])),
                tuple(m.name for m in rep.models if m.state is ModelState.READY),
            )
        else:
            part = (0, 0, 0, ())
        old = self._contrib[w]
        if part == old:
            return
        g = sw.region_index
        agg = self._agg[g]
        agg[0] += part[0] - old[0]
        agg[1] += part[1] - old[1]
        agg[2] += part[2] - old[2]
        if part[3] != old[3]:
            models: dict[str, int] = agg[3]
            for m in old[3]:
                models[m] -= 1
                if not models[m]:
                    del models[m]
            for m in part[3]:
                models[m] = models.get(m, 0) + 1
        self._contrib[w] = part
        self._summaries[g] = None

    def summaries(self) -> list[RegionSummary]:
        out = self._summaries
        for g, summary in enumerate(out):
            if summary is None:
                healthy, cap, busy, models = self._agg[g]
                out[g] = RegionSummary(
                    self.workers[self._region_workers[g][0]].region
                    if self._region_workers[g]
                    else "",
                    len(self._region_workers[g]),
                    healthy,
                    cap,
                    busy,
                    self.rtt_ms[g] if healthy else None,
                    frozenset(models),
                )
        return cast(list[RegionSummary], [s for s in out if s is not None and s.workers])

    def _fresh(self, g: int) -> list[WorkerSnapshot]:
        stale = self._stale[g]
        if stale:
            rows, region_rows, slot, build = (
                self._rows,
                self._region_rows[g],
                self._slot,
                self._build,
            )
            for w in stale:
                row = build(w)
                rows[w] = row
                region_rows[slot[w]] = row
            self._stale[g] = []
        return self._region_rows[g]

    def rows(self, regions: Sequence[str]) -> list[WorkerSnapshot]:
        out: list[WorkerSnapshot] = []
        for r in regions:
            g = self._region_of.get(r)
            if g is not None:
                out.extend(self._fresh(g))
        return out

    def all_rows(self) -> list[WorkerSnapshot]:
        for g in range(len(self._stale)):
            if self._stale[g]:
                self._fresh(g)
        return self._rows

    def _apply(self, at: float, kind: int, w: int, payload: object) -> None:
        if kind == OUTCOME:
            rid, failed = cast(tuple[int, bool], payload)
            self.assigned[w].pop(rid, None)
            if failed:
                self.failures[w].append(at)
                self.later(at + FAILURE_WINDOW_S, EXPIRE, w)
            self._touch(w)
        elif kind == HEALTH:
            self.health[w] = cast(tuple[bool, str], payload)
            self._touch(w)
        elif kind == EXPIRE:
            f = self.failures[w]
            while f and f[0] <= at - FAILURE_WINDOW_S + 1e-9:
                f.popleft()
            self._touch(w)
        elif kind == LINK:
            rtt, loss = cast(tuple[float, float], payload)
            self.rtt_ms[w] = rtt
            self.loss[w] = loss
            self._summaries[w] = None  # w: a region index here
            for i, sw in enumerate(self.workers):
                if sw.region_index == w:
                    self._touch(i)

    def _touch(self, w: int) -> None:
        if not self._is_dirty[w]:
            self._is_dirty[w] = True
            self._dirty.append(w)

    def _build(self, w: int) -> WorkerSnapshot:
        sw = self.workers[w]
        rep = self.reports[w]
        healthy, detail = self.health[w]
        g = sw.region_index
        return WorkerSnapshot(
            sw.worker_id,
            sw.region,
            sw.address,
            healthy,
            detail,
            rep.models,
            rep.draining,
            self.rtt_ms[g],
            self.loss[g],
            0.0,
            rep.running,
            rep.waiting,
            sw.max_running,
            rep.kv,
            rep.tps,
            rep.hit_rate,
            rep.gpu,
            len(self.assigned[w]),
            len(self.failures[w]),
        )

    def in_flight(self, w: int) -> int:
        return len(self.assigned[w])


OUTCOME, HEALTH, EXPIRE, LINK = range(4)
