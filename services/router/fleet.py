"""The fleet: what this router knows about every worker. Soft state, rebuilt from worker
streams in seconds (the one thing the router calls its "fleet"; the edge's copy of it, sent by
``GetView``, is the "view").

Inputs (all passed a ``now`` from the router's clock, so this module is tested without time):

- load reports from each worker's WatchLoad stream (``on_report``);
- RTT probes this router sends (``on_probe``: a round-trip time, or a lost probe);
- connection loss (``on_disconnect``) when a worker's stream breaks;
- its own assignments (``assign``) and the edge's outcome reports (``on_outcome``).

Output: ``snapshots(now)``, the immutable :class:`WorkerSnapshot` rows the scheduler ranks.

Health: a worker is healthy while its load stream is connected and its last report is younger
than ``stale_after_s``; a killed worker's stream breaks at once, a partitioned one goes stale —
either way it is down within a second with the defaults.

In-flight accounting: a load report covers the requests the worker had received when it sent
it. Assignments this router made after that are counted as ``in_flight`` on top, so a burst
between two reports does not herd onto one worker. Workers that say so
(``reports_admissions``) list the decision ids they admitted since the previous report on this
stream: those assignments are dropped exactly, the moment the worker's counts include them. An
assignment no report ever names (the request went elsewhere, or the list overflowed) is dropped
``admission_timeout_s`` after it was made; the edge's outcome report usually removes it first.

The other way round, a request that *ended* since the last report is still in that report's
``running``. When the edge's outcome for a request the reports already count arrives, the
worker's ``running`` is taken as one less until its next report (``ended``). Without that,
streams that end together — a closed-loop client's, all started at once with the same length —
look busy for up to a report interval while their clients' next requests are counted in flight
on top, and a worker at half its slots is refused as full (seen at 32 streams on 64 slots).
A report sent just before the end but received after the outcome counts the request once more,
until the next: the safe side again.

Whose requests they are: this router's decision ids start with its own random prefix
(``id_prefix``), so an admission list also tells whether anyone else sends to the worker — another
router replica, or an edge deciding on its own while the router was unreachable. A worker whose
last list naming any request named one of theirs (or that sends no lists) is ``shared``; one
whose lists named only this router's requests, or none yet, is not, and its ``in_flight`` is
exact (the max-score picker draws against herding only where another router is sending too).

For workers without that list, timing decides: a request routed at ``t`` reaches the worker at
about ``t + grace + one-way`` (``in_flight_grace_s``: the edge's own processing) and a report
sent after that arrives one more one-way later; so a report received at ``now`` covers the
assignments made before ``now - rtt - grace``. Counting a request twice for that short window
is the safe side: forgetting it early lets a burst overfill a worker that looked free.

Cost. ``snapshots`` is on every decision's path, so it does not walk the workers: it keeps the
list of the last call and rebuilds only the rows that changed since (a report, a probe, an
assignment, an outcome) or that reached a *deadline* — the instant a row's meaning changes with
time alone: its last report goes stale, its oldest assignment or failure expires, or it is
``snapshot_max_age_s`` old (which bounds how stale ``report_age_s`` can be). Deadlines sit in a
heap; a decision between two reports costs a list copy (a few microseconds at 1,000 workers).
Unchanged rows keep their snapshot *object*, which is what lets the scheduler re-evaluate only
the workers that changed.

Aliases. Two addresses can lead to the same worker (a static address and a DNS name, or a
worker listening on two interfaces). The worker is listed once, under the address that
described it first; another address takes over when the listed one loses its connection and
the other has one.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from meridian.v1 import worker_pb2
from services.common.capabilities import Capabilities
from services.router.scheduling.types import ModelState, ModelStatus, WorkerSnapshot

_STATE_FROM_PB = {
    worker_pb2.MODEL_STATE_LOADING: ModelState.LOADING,
    worker_pb2.MODEL_STATE_READY: ModelState.READY,
    worker_pb2.MODEL_STATE_DRAINING: ModelState.DRAINING,
    worker_pb2.MODEL_STATE_FAILED: ModelState.FAILED,
}

# A deadline is never set closer than this to the rebuild that computed it, so a row sitting
# exactly on a boundary is not rebuilt on every call.
_MIN_DEADLINE_S = 0.001
#: Requests remembered per worker as counted by its reports, awaiting their outcome: more are
#: streams whose edge never reported (it died); the oldest are forgotten.
_MAX_COUNTED = 65_536


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetConfig:
    """How the live view ages.

    ``stale_after_s``: a worker whose last load report is older is down (partitions, hung
    processes). ``rtt_window``: probes over which the RTT is the minimum sample — the network
    distance, as TCP's min-RTT filter measures it: a probe also waits on both ends' event
    loops, and those delays (load, a busy box) would otherwise read as distance and make
    workers of one site look tens of milliseconds apart; a real rise in the path's delay shows
    once a window of probes (1 s at the default 250 ms interval) has seen it. ``loss_window``:
    probes over which packet loss is measured. ``assignment_ttl_s``: an assignment no report or
    outcome ever covered stops counting as in flight after this long (a lost outcome must not
    leak load). ``failure_window_s``: how long a failed request counts against its worker.
    ``snapshot_max_age_s``: the longest a row is reused without a rebuild (bounds the error of
    ``report_age_s``; rows are rebuilt on every change anyway). ``in_flight_grace_s``: time
    between a decision and the edge's Generate call leaving (see in-flight accounting above).
    ``admission_timeout_s``: with admission lists, how long an unnamed assignment still counts.
    """

    stale_after_s: float = 0.6
    in_flight_grace_s: float = 0.02
    admission_timeout_s: float = 2.0
    rtt_window: int = 4
    loss_window: int = 20
    assignment_ttl_s: float = 30.0
    failure_window_s: float = 30.0
    snapshot_max_age_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.stale_after_s > 0:
            raise ValueError("stale_after_s must be > 0")
        if self.rtt_window < 1:
            raise ValueError("rtt_window must be >= 1")
        if self.loss_window < 1:
            raise ValueError("loss_window must be >= 1")
        if not self.assignment_ttl_s > 0 or not self.failure_window_s > 0:
            raise ValueError("assignment_ttl_s and failure_window_s must be > 0")
        if not self.snapshot_max_age_s >= 0:
            raise ValueError("snapshot_max_age_s must be >= 0")
        if not self.in_flight_grace_s >= 0:
            raise ValueError("in_flight_grace_s must be >= 0")
        if not self.admission_timeout_s > 0:
            raise ValueError("admission_timeout_s must be > 0")


@dataclass(slots=True, eq=False)
class _Record:
    address: str
    worker_id: str = ""
    region: str = ""
    connected: bool = False
    down_reason: str = "not connected yet"
    report: worker_pb2.LoadReport | None = None
    report_at: float = 0.0
    rtt_ms: float | None = None  # min of ``rtt_samples``
    rtt_samples: collections.deque[float] = field(default_factory=collections.deque)
    probes: collections.deque[bool] = field(default_factory=collections.deque)
    lost: int = 0  # probes lost among ``probes``
    # decision_id → time assigned (router clock), in assignment order (oldest first)
    assignments: dict[str, float] = field(default_factory=dict)
    failures: collections.deque[float] = field(default_factory=collections.deque)
    models: tuple[ModelStatus, ...] = ()  # decoded from ``report``, kept while it is unchanged
    shadowed: bool = False  # an alias of a worker listed under another address
    snapshot: WorkerSnapshot | None = None
    index: int = -1  # position in the listed rows, -1 when not listed
    dirty: bool = False
    due: float = math.inf
    # another source's requests were in the last admission list naming any (or a report came
    # without lists: who else sends cannot be told); none named yet: no one else's arrived
    shared: bool = False
    # decision_id → time: this router's requests that the worker's reports count (their
    # assignment was released by a report), until their outcome arrives (oldest first)
    counted: dict[str, float] = field(default_factory=dict)
    # outcomes of ``counted`` requests since the last report: not running any more
    ended: int = 0


class Fleet:
    def __init__(
        self,
        config: FleetConfig | None = None,
        *,
        stalled_since: Callable[[float], float] | None = None,
        id_prefix: str | None = None,
    ) -> None:
        """``stalled_since(t)``: seconds since ``t`` (router clock) that this process's own
        event loop could not run (:meth:`services.common.loopwatch.LoopWatch.stalled_since`).
        A report's age does not count them: a router that stalls past ``stale_after_s`` (a
        long GC pass, a CPU-throttled container) has not heard from its workers because it
        was not listening, and must not call them all down when it resumes — their reports
        are waiting in the streams. A partitioned worker is still found, that much later.

        ``id_prefix``: what this router's decision ids start with (random by default: unique
        across replicas without coordination); an admitted id without it is someone else's."""
        self._config = config or FleetConfig()
        self.id_prefix = id_prefix if id_prefix is not None else secrets.token_hex(6) + "-"
        self._stalled_since = stalled_since
        self._by_address: dict[str, _Record] = {}
        self._owner: dict[str, str] = {}  # worker_id → the address it is listed under
        self._group: dict[str, dict[str, None]] = {}  # worker_id → its addresses, in order
        self._listed: list[_Record] = []
        self._snaps: list[WorkerSnapshot] = []
        self._layout_changed = True
        self._dirty: list[_Record] = []
        self._deadlines: list[tuple[float, int, _Record]] = []
        self._seq = itertools.count()

    @property
    def config(self) -> FleetConfig:
        return self._config

    # --- membership -----------------------------------------------------------------------

    def add(self, address: str) -> None:
        self._by_address.setdefault(address, _Record(address=address))

    def remove(self, address: str) -> None:
        rec = self._by_address.pop(address, None)
        if rec is None:
            return
        rec.index = -1
        if rec.worker_id:
            self._leave_group(rec)
            if self._owner.get(rec.worker_id) == address:
                del self._owner[rec.worker_id]
                self._elect(rec.worker_id)
        self._layout_changed = True

    def addresses(self) -> list[str]:
        return list(self._by_address)

    # --- inputs ---------------------------------------------------------------------------

    def on_describe(self, address: str, info: worker_pb2.WorkerInfo) -> None:
        rec = self._by_address.get(address)
        if rec is None:
            return
        self._identify(rec, info.worker_id, info.region)
        self._touch(rec)

    def on_report(self, address: str, report: worker_pb2.LoadReport, now: float) -> None:
        rec = self._by_address.get(address)
        if rec is None:
            return
        was_connected = rec.connected
        rec.connected = True
        rec.down_reason = ""
        previous = rec.report
        rec.report = report
        rec.report_at = now
        if previous is None or previous.models != report.models:
            rec.models = tuple(
                ModelStatus(
                    name=m.name,
                    state=_STATE_FROM_PB.get(m.state, ModelState.FAILED),
                    max_model_len=m.max_model_len,
                    capabilities=Capabilities.from_pb(m),
                    created_unix_s=m.created_unix_s,
                )
                for m in report.models
            )
        if report.worker_id and (report.worker_id != rec.worker_id or report.region != rec.region):
            self._identify(rec, report.worker_id, report.region)
        elif not was_connected and rec.shadowed:
            self._elect(rec.worker_id)
        if not report.reports_admissions:
            rec.shared = True
        elif report.admitted_decision_ids:
            prefix = self.id_prefix
            rec.shared = not all(d.startswith(prefix) for d in report.admitted_decision_ids)
        # Requests that reached the worker before the report left it are in its counts now.
        rec.ended = 0
        if rec.assignments:
            counted = rec.counted
            if report.reports_admissions:
                for decision_id in report.admitted_decision_ids:
                    if rec.assignments.pop(decision_id, None) is not None:
                        counted[decision_id] = now
                covered_before = now - self._config.admission_timeout_s
                kept = {d: t for d, t in rec.assignments.items() if t > covered_before}
            else:
                covered_before = now - (rec.rtt_ms or 0.0) / 1000.0 - self._config.in_flight_grace_s
                kept = {}
                for d, t in rec.assignments.items():
                    if t > covered_before:
                        kept[d] = t
                    else:
                        counted[d] = now
            rec.assignments = kept
            while len(counted) > _MAX_COUNTED:  # outcomes that never came (an edge died)
                del counted[next(iter(counted))]
        self._touch(rec)

    def on_probe(self, address: str, rtt_ms: float | None) -> None:
        """Record one probe: its round-trip time, or ``None`` when it was lost."""
        rec = self._by_address.get(address)
        if rec is None:
            return
        before = (rec.rtt_ms, rec.lost, len(rec.probes))
        ok = rtt_ms is not None
        rec.probes.append(ok)
        rec.lost += not ok
        while len(rec.probes) > self._config.loss_window:
            rec.lost -= not rec.probes.popleft()
        if rtt_ms is not None:
            samples = rec.rtt_samples
            samples.append(rtt_ms)
            if len(samples) > self._config.rtt_window:
                samples.popleft()
            rec.rtt_ms = min(samples)
        if (rec.rtt_ms, rec.lost, len(rec.probes)) != before:  # else the row stands as it is
            self._touch(rec)

    def on_disconnect(self, address: str, reason: str) -> None:
        rec = self._by_address.get(address)
        if rec is None:
            return
        rec.connected = False
        rec.down_reason = reason
        if rec.worker_id and not rec.shadowed:
            self._elect(rec.worker_id)
        self._touch(rec)

    def assign(self, worker_id: str, decision_id: str, now: float) -> None:
        rec = self._record_of(worker_id)
        if rec is not None:
            rec.assignments[decision_id] = now
            self._touch(rec)

    def on_outcome(self, worker_id: str, decision_id: str, failed: bool, now: float) -> None:
        rec = self._record_of(worker_id)
        if rec is None:
            return
        unreported = rec.assignments.pop(decision_id, None) is not None
        if not unreported and rec.counted.pop(decision_id, None) is not None:
            rec.ended += 1  # in the last report's running, but over now
        if failed:
            rec.failures.append(now)
        self._touch(rec)

    # --- output ---------------------------------------------------------------------------

    def snapshots(self, now: float) -> list[WorkerSnapshot]:
        """Every worker that has described itself (once per worker id), as the scheduler
        should see it now. Rows that did not change keep their snapshot object."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            due, _, rec = heapq.heappop(deadlines)
            if due == rec.due:
                rec.due = math.inf
                self._touch(rec)
        if self._layout_changed:
            self._relayout()
        dirty, self._dirty = self._dirty, []
        snaps = self._snaps
        for rec in dirty:
            rec.dirty = False
            if rec.index >= 0:
                snaps[rec.index] = self._rebuild(rec, now)
            else:
                rec.snapshot = None  # not listed: built when it is
        return snaps.copy()

    def report_age_s(self, worker_id: str, now: float) -> float | None:
        rec = self._record_of(worker_id)
        return None if rec is None or rec.report is None else self._report_age(rec, now)

    def last_report(self, worker_id: str) -> worker_pb2.LoadReport | None:
        rec = self._record_of(worker_id)
        return None if rec is None else rec.report

    def address_of(self, worker_id: str) -> str | None:
        """The address a worker is listed under (``None`` when unknown)."""
        return self._owner.get(worker_id)

    # --- internals ------------------------------------------------------------------------

    def _record_of(self, worker_id: str) -> _Record | None:
        address = self._owner.get(worker_id)
        return None if address is None else self._by_address.get(address)

    def _touch(self, rec: _Record) -> None:
        if not rec.dirty:
            rec.dirty = True
            self._dirty.append(rec)

    def _identify(self, rec: _Record, worker_id: str, region: str) -> None:
        """The worker at ``rec`` says who it is: (re)assign ownership of its id."""
        if rec.worker_id == worker_id:
            if rec.region != region:
                rec.region = region
                self._layout_changed = True
            return
        if rec.worker_id:
            old = rec.worker_id
            self._leave_group(rec)
            rec.worker_id = ""
            if self._owner.get(old) == rec.address:
                del self._owner[old]
                self._elect(old)
        rec.worker_id, rec.region = worker_id, region
        self._group.setdefault(worker_id, {})[rec.address] = None
        self._elect(worker_id)
        self._layout_changed = True

    def _leave_group(self, rec: _Record) -> None:
        group = self._group.get(rec.worker_id)
        if group is not None:
            group.pop(rec.address, None)
            if not group:
                del self._group[rec.worker_id]

    def _elect(self, worker_id: str) -> None:
        """Choose the address a worker id is listed under: the current one while it is
        connected, else the first connected alias, else the current (or first) one."""
        by_address = self._by_address
        group = [by_address[a] for a in self._group.get(worker_id, ()) if a in by_address]
        if not group:
            self._owner.pop(worker_id, None)
            return
        current = self._by_address.get(self._owner.get(worker_id, ""))
        if current is None or current.worker_id != worker_id:
            current = None
        if current is None or not current.connected:
            current = next((r for r in group if r.connected), current or group[0])
        self._owner[worker_id] = current.address
        for r in group:
            shadowed = r is not current
            if r.shadowed != shadowed:
                r.shadowed = shadowed
                self._layout_changed = True
                self._touch(r)

    def _relayout(self) -> None:
        self._layout_changed = False
        for rec in self._listed:
            rec.index = -1
        listed = [r for r in self._by_address.values() if r.worker_id and not r.shadowed]
        for i, rec in enumerate(listed):
            rec.index = i
            if rec.snapshot is None and not rec.dirty:
                self._touch(rec)
        self._listed = listed
        # Placeholders are replaced by the dirty pass that follows (every row without a
        # snapshot is dirty).
        self._snaps = [r.snapshot or _PLACEHOLDER for r in listed]

    def _report_age(self, rec: _Record, now: float) -> float:
        """How long since ``rec``'s last report, less the router's own stalls since then."""
        age = now - rec.report_at
        if self._stalled_since is not None and age > 0:
            age -= min(age, self._stalled_since(rec.report_at))
        return age

    def _healthy(self, rec: _Record, age: float) -> bool:
        return rec.connected and rec.report is not None and age <= self._config.stale_after_s

    def _rebuild(self, rec: _Record, now: float) -> WorkerSnapshot:
        cfg = self._config
        assignments = rec.assignments
        if assignments and next(iter(assignments.values())) < now - cfg.assignment_ttl_s:
            cutoff = now - cfg.assignment_ttl_s
            rec.assignments = assignments = {d: t for d, t in assignments.items() if t >= cutoff}
        failures = rec.failures
        while failures and failures[0] < now - cfg.failure_window_s:
            failures.popleft()
        age = self._report_age(rec, now)
        healthy = self._healthy(rec, age)
        snap = self._build(rec, age, healthy, now)
        rec.snapshot = snap
        due = now + cfg.snapshot_max_age_s
        if healthy:
            due = min(due, now + cfg.stale_after_s - age)
        if assignments:
            due = min(due, next(iter(assignments.values())) + cfg.assignment_ttl_s)
        if failures:
            due = min(due, failures[0] + cfg.failure_window_s)
        due = max(due, now + _MIN_DEADLINE_S)
        rec.due = due
        heapq.heappush(self._deadlines, (due, next(self._seq), rec))
        return snap

    def _build(self, rec: _Record, age: float, healthy: bool, now: float) -> WorkerSnapshot:
        """``rec``'s row; ``age``: its report's age (:meth:`_report_age`)."""
        window = self._config.failure_window_s
        clears = tuple(t + window - now for t in rec.failures) if rec.failures else ()
        if healthy:
            detail = "ok"
        elif not rec.connected:
            detail = rec.down_reason or "disconnected"
        else:
            detail = f"no load report for {age:.1f}s"
        loss = rec.lost / len(rec.probes) if rec.probes else 0.0
        report = rec.report
        if report is None:
            return WorkerSnapshot(
                worker_id=rec.worker_id,
                region=rec.region,
                address=rec.address,
                healthy=False,
                health_detail=detail,
                rtt_ms=rec.rtt_ms,
                loss=loss,
                in_flight=len(rec.assignments),
                recent_failures=len(rec.failures),
                failures_clear_in_s=clears,
            )
        gpus = report.gpus
        return WorkerSnapshot(
            worker_id=rec.worker_id,
            region=rec.region,
            address=rec.address,
            healthy=healthy,
            health_detail=detail,
            models=rec.models,
            draining=report.draining,
            rtt_ms=rec.rtt_ms,
            loss=loss,
            report_age_s=age,
            running=max(0, report.running - rec.ended),
            waiting=report.waiting,
            max_running=max(report.max_running, 1),
            kv_cache_usage=report.kv_cache_usage,
            tokens_per_second=report.tokens_per_second,
            prefix_cache_hit_rate=report.prefix_cache_hit_rate,
            gpu_utilization=max(g.utilization for g in gpus) if gpus else None,
            in_flight=len(rec.assignments),
            recent_failures=len(rec.failures),
            failures_clear_in_s=clears,
            shared=rec.shared,
        )


_PLACEHOLDER = WorkerSnapshot(worker_id="", region="", address="", healthy=False)
