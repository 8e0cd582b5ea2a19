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
from typing import cast

from services.router.scheduling.types import ModelStatus, WorkerSnapshot

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
    __slots__ = (
        "_dirty",
        "_is_dirty",
        "_pending",
        "_seq",
        "assigned",
        "cursors",
        "failures",
        "health",
        "loss",
        "owd_s",
        "reports",
        "rows",
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
        self.rows = [self._build(i) for i in range(len(workers))]

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
        """Apply everything that has reached this site by ``now``; the rows for the scheduler."""
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
            rows = self.rows
            is_dirty = self._is_dirty
            build = self._build
            for w in self._dirty:
                is_dirty[w] = False
                rows[w] = build(w)
            self._dirty = []
        return self.rows

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
