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

import bisect
import heapq
import itertools
import math
import operator
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from typing import NamedTuple, cast

from services.router.scheduling.regional import RegionSummary
from services.router.scheduling.types import ModelStatus, WorkerSnapshot

FAILURE_WINDOW_S = 30.0
_GE = operator.ge
# A named tuple built from one tuple at C level (what ``_make`` does, without its Python
# frame): a view builds ~20 region summaries per decision at planet scale.
_new_summary = cast(
    "Callable[[type[RegionSummary], tuple[object, ...]], RegionSummary]", tuple.__new__
)
_SUB = operator.sub


class Report(NamedTuple):
    """A worker's load report. A named tuple, not a frozen dataclass: one is made per report
    (thousands per simulated second), and a tuple is built ~3x faster."""

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
    #: the replicas whose requests ``admitted`` names, one bit per site index: a replica
    #: reads whether another one sends to the worker (``WorkerSnapshot.shared``), as the real
    #: router reads the other replicas' prefixes in the admitted decision ids
    by: int = 0


#: a region's aggregate at its source: (healthy workers, their slots, busy slots, ready models)
Aggregate = tuple[int, int, int, frozenset[str]]


class RegionLog:
    """Reports sent by one region's workers, in send order: ``(sent_at, worker, report)``
    (worker -1, report None: only the region's aggregate moved — a worker died or came
    back), ``times`` for bisection; what replicas apply, region by region, to their rows.

    Beside them, the entries a replica's *region summary* can see (``change_times``, with the
    region's aggregate after each, ``change_aggs``): those that moved the aggregate, or that
    name admitted requests (they end a replica's requests in flight there). Most reports
    change a worker's token rate or KV figures and nothing a summary reads; leaving them out
    is what lets a replica skip a region until something it would see has arrived. The
    aggregate is kept at the source, once per report, and read by every replica at its own
    horizon: what a replica's region stage reads without applying the reports one by one."""

    __slots__ = (
        "base",
        "change_aggs",
        "change_base",
        "change_times",
        "entries",
        "initial",
        "last",
        "times",
        "waiters",
    )

    def __init__(self, initial: Aggregate = (0, 0, 0, frozenset())) -> None:
        self.entries: list[tuple[float, int, Report | None]] = []
        self.times: list[float] = []
        self.base = 0  # absolute index of entries[0]
        self.change_times: list[float] = []
        self.change_aggs: list[Aggregate] = []
        self.change_base = 0  # absolute index of change_times[0]
        self.initial = initial  # the aggregate before change_aggs[0]
        self.last = initial  # the aggregate after the last entry
        # Replicas that have read every change, each with the list in which it keeps, per
        # region, the sent-time of the first change it has not read, and this region's index:
        # told by the next change (once), so an idle region costs them nothing meanwhile.
        self.waiters: list[tuple[list[float], int]] = []

    def append(self, t: float, w: int, rep: Report | None, agg: Aggregate) -> None:
        self.entries.append((t, w, rep))
        self.times.append(t)
        if agg == self.last and (rep is None or not rep.admitted):
            return
        self.last = agg
        self.change_times.append(t)
        self.change_aggs.append(agg)
        if self.waiters:
            for first_unread, g in self.waiters:
                if t < first_unread[g]:  # (-inf: the replica has marked it changed meanwhile)
                    first_unread[g] = t
            self.waiters.clear()

    def trim(self, upto: int) -> None:
        """Drop the entries before absolute index ``upto`` (every replica has applied them),
        and the changes sent by the last of them (every replica's horizon has passed it)."""
        cut = upto - self.base
        if cut > 0:
            until = self.times[cut - 1]
            del self.entries[:cut]
            del self.times[:cut]
            self.base = upto
            k = bisect.bisect_right(self.change_times, until)
            if k:
                self.initial = self.change_aggs[k - 1]
                del self.change_times[:k]
                del self.change_aggs[:k]
                self.change_base += k


@dataclass(frozen=True, slots=True)
class StaticWorker:
    worker_id: str
    region: str
    region_index: int
    address: str
    max_running: int


class SiteView:
    """One replica's registry, and a :class:`~services.router.scheduling.regional.RegionalView`
    of it. Lazy, region by region: a region's reports are applied (and its rows rebuilt) when
    a decision asks for its rows, or when this replica has requests in flight there (their
    admissions end them); region summaries come from the regions' logs' aggregates at this
    replica's horizon, plus its own requests in flight there. So a profile with region
    pre-selection costs what its chosen regions cost, not what the planet does."""

    __slots__ = (
        "_acur",
        "_logs",
        "_now",
        "_others",
        "_own",
        "_pending",
        "_region_of",
        "_region_rows",
        "_region_workers",
        "_rows",
        "_seq",
        "_slot",
        "_stale",
        "_stale_flag",
        "_summary_at",
        "_summary_head",
        "_summary_key",
        "_summary_list",
        "_valid_until",
        "_waiting_at",
        "assigned",
        "cursors",
        "failures",
        "health",
        "loss",
        "owd_s",
        "reports",
        "rtt_ms",
        "shared",
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
        index: int = 0,
    ) -> None:
        """``index``: this replica's site index, its bit in ``Report.by``."""
        self.site = site
        self._others = ~(1 << index)  # the bits of every other replica
        # per worker: whether its last admissions named another replica's requests (none
        # named yet: not shared — no one else's request has reached it — as in the fleet)
        self.shared = [False] * len(workers)
        self.workers = workers
        regions = max(w.region_index for w in workers) + 1
        self.rtt_ms = list(rtt_ms)  # per region, as this site's probes measure it
        self.loss = list(loss)
        self.owd_s = [r / 2000.0 for r in rtt_ms]
        self.reports = list(initial)
        self.assigned: list[dict[int, None]] = [{} for _ in workers]
        self.failures: list[deque[float]] = [deque() for _ in workers]
        self.health: list[tuple[bool, str]] = [(True, "ok")] * len(workers)
        self.cursors = [0] * regions  # per region: the next log entry to apply
        self._acur = [0] * regions  # per region: the log change its summary was read at
        self._own = [0] * regions  # per region: this replica's requests in flight there
        self._logs: Sequence[RegionLog] = ()
        self._now = 0.0
        self._pending: list[tuple[float, int, int, int, object]] = []
        self._seq = itertools.count()
        self._rows = [self._build(i) for i in range(len(workers))]
        self._region_of: dict[str, int] = {}
        self._region_workers: list[list[int]] = [[] for _ in range(regions)]
        self._slot = [0] * len(workers)
        for i, sw in enumerate(workers):
            self._region_of.setdefault(sw.region, sw.region_index)
            self._slot[i] = len(self._region_workers[sw.region_index])
            self._region_workers[sw.region_index].append(i)
        self._region_rows = [[self._rows[i] for i in ws] for ws in self._region_workers]
        self._stale: list[list[int]] = [[] for _ in range(regions)]
        self._stale_flag = [False] * len(workers)
        # The region summaries (regions with workers, in index order) and, per region, its
        # position there (-1: no workers), its figures, and the sent-time before which they
        # stand (-inf: read it again; +inf: never, no workers): see summaries().
        self._summary_at = [-1] * regions
        self._summary_list: list[RegionSummary] = []
        placeholder = RegionSummary("", 0, 0, 0, 0, None, frozenset())
        for g, ws in enumerate(self._region_workers):
            if ws:
                self._summary_at[g] = len(self._summary_list)
                self._summary_list.append(placeholder)
        self._summary_key: list[tuple[object, ...] | None] = [None] * regions
        # (name, workers listed): the fields of a region's summary that never change
        self._summary_head = [
            (workers[ws[0]].region, len(ws)) if ws else ("", 0) for ws in self._region_workers
        ]
        self._valid_until = [-math.inf if at >= 0 else math.inf for at in self._summary_at]
        self._waiting_at = [-1] * regions  # per region: the change count it waits beyond

    # --- inputs (timestamped with when they reach this site) ------------------------------

    def later(self, at: float, kind: int, worker: int, payload: object = None) -> None:
        """Something this replica learns at ``at``: OUTCOME (payload (rid, failed)), HEALTH
        (payload (healthy, detail)), LINK (worker = region index, payload (rtt_ms, loss))."""
        heapq.heappush(self._pending, (at, next(self._seq), kind, worker, payload))

    def assign(self, worker: int, rid: int) -> None:
        mine = self.assigned[worker]
        if rid not in mine:
            mine[rid] = None
            g = self.workers[worker].region_index
            self._own[g] += 1
            self._region_changed(g)
        self._touch(worker)

    def _end(self, w: int, rid: int) -> None:
        mine = self.assigned[w]
        if rid in mine:
            del mine[rid]
            g = self.workers[w].region_index
            self._own[g] -= 1
            self._region_changed(g)

    # --- time ----------------------------------------------------------------------------

    def sync(self, now: float, logs: Sequence[RegionLog]) -> list[WorkerSnapshot]:
        """Apply everything that has reached this site by ``now``; every row, current."""
        self.advance(now, logs)
        return self.all_rows()

    def advance(self, now: float, logs: Sequence[RegionLog]) -> None:
        """Move this replica to ``now``: what reached it by then (outcomes, health, links)
        is applied; regions' reports are applied when their region is asked for."""
        self._now = now
        self._logs = logs
        pending = self._pending
        while pending and pending[0][0] <= now:
            at, _, kind, w, payload = heapq.heappop(pending)
            self._apply(at, kind, w, payload)

    def catch_up(self, g: int) -> None:
        """Apply region ``g``'s reports that have reached this site by now.

        Only a worker's last report among them is kept, so each worker is applied once (the
        10-s catch-up of every replica reads ~50 reports per worker it keeps one of); the
        admissions are read from all of them: whose requests they name (``shared``: another
        replica's?), and, while this replica has requests in flight in the region, which of
        its own they end (nothing else can end)."""
        log = self._logs[g]
        entries = log.entries
        base = log.base
        i = self.cursors[g] - base
        if i >= len(entries):
            return
        # entries are in send order: the ones sent by this replica's horizon are a prefix
        j = bisect.bisect_right(log.times, self._now - self.owd_s[g], i)
        if j == i:
            return
        self.cursors[g] = j + base
        chunk = entries[i:j]
        others, shared = self._others, self.shared
        if self._own[g]:
            assigned, end = self.assigned, self._end
            for _, w, rep in chunk:
                if rep is not None and rep.admitted:
                    shared[w] = rep.by & others != 0
                    if assigned[w]:
                        for rid in rep.admitted:
                            end(w, rid)
        else:
            for _, w, rep in chunk:
                if rep is not None and rep.admitted:
                    shared[w] = rep.by & others != 0
        latest = {w: rep for _, w, rep in chunk if rep is not None}
        if latest:
            reports, flag = self.reports, self._stale_flag
            stale = self._stale[g]
            for w, rep in latest.items():
                reports[w] = rep
                if not flag[w]:
                    flag[w] = True
                    stale.append(w)

    def catch_up_all(self) -> None:
        for g in range(len(self._logs)):
            self.catch_up(g)

    def _apply(self, at: float, kind: int, w: int, payload: object) -> None:
        if kind == OUTCOME:
            rid, failed = cast(tuple[int, bool], payload)
            self._end(w, rid)
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
            self._region_changed(w)
            for i in self._region_workers[w]:  # w: a region index here
                self._touch(i)

    def _touch(self, w: int) -> None:
        if not self._stale_flag[w]:
            self._stale_flag[w] = True
            self._stale[self.workers[w].region_index].append(w)

    # --- the RegionalView the router's region stage reads --------------------------------

    def summaries(self) -> list[RegionSummary]:
        """Every listed region's summary at this replica's horizon (the same list object each
        call, valid until the next).

        A summary changes only when one of its log's changes (``RegionLog``) reaches this
        site, or this replica's own requests in flight there or its RTT change; most do not
        between two decisions. So each region keeps the sent-time before which its summary
        stands (the first unread change's; +inf after reading them all, until the next change
        sets it), and one C-level pass picks the regions whose horizon has reached it; only
        those are read again. A re-read that finds the same figures keeps the old object, so
        the region stage (which re-ranks a region only when handed a new object) skips it."""
        now = self._now
        owd = self.owd_s
        valid = self._valid_until
        due = list(compress(range(len(valid)), map(_GE, map(_SUB, repeat(now), owd), valid)))
        if not due:
            return self._summary_list
        # _read_summary, inlined (~20 regions per decision; the calls were a fifth of it)
        own, logs, rtts, acur = self._own, self._logs, self.rtt_ms, self._acur
        keys, waiting = self._summary_key, self._waiting_at
        bisect_right = bisect.bisect_right
        for g in due:
            if own[g]:
                self.catch_up(g)  # its admissions end this replica's requests in flight
            log = logs[g]
            # The aggregate as of this replica's horizon there: the last change sent by then.
            times, base = log.change_times, log.change_base
            lo = acur[g] - base
            i = bisect_right(times, now - owd[g], lo if lo > 0 else 0)
            healthy, cap, busy, models = log.change_aggs[i - 1] if i else log.initial
            acur[g] = at = i + base
            if i < len(times):
                valid[g] = times[i]
            else:  # read them all: the next change says when (one waiter per change awaited)
                valid[g] = math.inf
                if waiting[g] != at:
                    waiting[g] = at
                    log.waiters.append((valid, g))
            busy += own[g]
            key = (healthy, cap, cap if cap < busy else busy, rtts[g] if healthy else None, models)
            if key != keys[g]:
                keys[g] = key
                self._summary_list[self._summary_at[g]] = _new_summary(
                    RegionSummary, self._summary_head[g] + key
                )
        return self._summary_list

    def _region_changed(self, g: int) -> None:
        """This replica's requests in flight in region ``g``, or its RTT, changed: its
        summary is read again at the next decision."""
        if self._summary_at[g] >= 0:
            self._valid_until[g] = -math.inf

    def _fresh(self, g: int) -> list[WorkerSnapshot]:
        self.catch_up(g)
        stale = self._stale[g]
        if stale:
            rows, region_rows, slot = self._rows, self._region_rows[g], self._slot
            build, flag = self._build, self._stale_flag
            for w in stale:
                flag[w] = False
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
        for g in range(len(self._region_workers)):
            self._fresh(g)
        return self._rows

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
            self.shared[w],
        )

    def in_flight(self, w: int) -> int:
        return len(self.assigned[w])


OUTCOME, HEALTH, EXPIRE, LINK = range(4)
