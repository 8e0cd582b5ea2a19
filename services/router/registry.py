"""The router's live view of every worker: soft state, rebuilt from worker streams in seconds.

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
it. Assignments this router made after that (taking one-way network delay into account) are
counted as ``in_flight`` on top, so a burst between two reports does not herd onto one worker.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from meridian.v1 import worker_pb2
from services.router.scheduling.types import ModelState, ModelStatus, WorkerSnapshot

_STATE_FROM_PB = {
    worker_pb2.MODEL_STATE_LOADING: ModelState.LOADING,
    worker_pb2.MODEL_STATE_READY: ModelState.READY,
    worker_pb2.MODEL_STATE_DRAINING: ModelState.DRAINING,
    worker_pb2.MODEL_STATE_FAILED: ModelState.FAILED,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryConfig:
    stale_after_s: float = 0.6
    rtt_ewma_alpha: float = 0.3
    loss_window: int = 20
    assignment_ttl_s: float = 30.0
    failure_window_s: float = 30.0
    # A snapshot is reused for this long unless a report, probe or assignment changes it;
    # bounds how stale report_age_s and health can be (and saves work at 1,000 workers).
    snapshot_max_age_s: float = 0.05

    def __post_init__(self) -> None:
        if not self.stale_after_s > 0:
            raise ValueError("stale_after_s must be > 0")
        if not 0 < self.rtt_ewma_alpha <= 1:
            raise ValueError("rtt_ewma_alpha must be in (0, 1]")
        if self.loss_window < 1:
            raise ValueError("loss_window must be >= 1")
        if not self.assignment_ttl_s > 0 or not self.failure_window_s > 0:
            raise ValueError("assignment_ttl_s and failure_window_s must be > 0")
        if self.snapshot_max_age_s < 0:
            raise ValueError("snapshot_max_age_s must be >= 0")


@dataclass(slots=True)
class _Record:
    address: str
    worker_id: str = ""
    region: str = ""
    connected: bool = False
    down_reason: str = "not connected yet"
    report: worker_pb2.LoadReport | None = None
    report_at: float = 0.0
    rtt_ms: float | None = None
    probes: collections.deque[bool] = field(default_factory=collections.deque)
    # decision_id → time assigned (router clock)
    assignments: dict[str, float] = field(default_factory=dict)
    failures: collections.deque[float] = field(default_factory=collections.deque)
    snapshot: WorkerSnapshot | None = None  # cached until something changes
    snapshot_at: float = 0.0


class WorkerRegistry:
    def __init__(self, config: RegistryConfig | None = None) -> None:
        self._config = config or RegistryConfig()
        self._by_address: dict[str, _Record] = {}
        self._address_of: dict[str, str] = {}  # worker_id → address

    # --- membership -----------------------------------------------------------------------

    def add(self, address: str) -> None:
        self._by_address.setdefault(address, _Record(address=address))

    def remove(self, address: str) -> None:
        rec = self._by_address.pop(address, None)
        if rec and self._address_of.get(rec.worker_id) == address:
            del self._address_of[rec.worker_id]

    def addresses(self) -> list[str]:
        return list(self._by_address)

    # --- inputs ---------------------------------------------------------------------------

    def on_describe(self, address: str, info: worker_pb2.WorkerInfo) -> None:
        rec = self._by_address.get(address)
        if rec is None:
            return
        rec.worker_id, rec.region = info.worker_id, info.region
        self._address_of[info.worker_id] = address
        rec.snapshot = None

    def on_report(self, address: str, report: worker_pb2.LoadReport, now: float) -> None:
        rec = self._by_address.get(address)
        if rec is None:
            return
        rec.connected = True
        rec.down_reason = ""
        rec.report = report
        rec.report_at = now
        if report.worker_id and report.worker_id != rec.worker_id:
            rec.worker_id, rec.region = report.worker_id, report.region
            self._address_of[report.worker_id] = address
        # Requests assigned before the report left the worker are in its counts now.
        one_way_s = (rec.rtt_ms or 0.0) / 2000.0
        covered_before = now - one_way_s
        rec.assignments = {d: t for d, t in rec.assignments.items() if t > covered_before}
        rec.snapshot = None

    def on_probe(self, address: str, rtt_ms: float | None) -> None:
        """Record one probe: its round-trip time, or ``None`` when it was lost."""
        rec = self._by_address.get(address)
        if rec is None:
            return
        rec.probes.append(rtt_ms is not None)
        while len(rec.probes) > self._config.loss_window:
            rec.probes.popleft()
        if rtt_ms is not None:
            a = self._config.rtt_ewma_alpha
            rec.rtt_ms = rtt_ms if rec.rtt_ms is None else a * rtt_ms + (1 - a) * rec.rtt_ms
        rec.snapshot = None

    def on_disconnect(self, address: str, reason: str) -> None:
        rec = self._by_address.get(address)
        if rec is None:
            return
        rec.connected = False
        rec.down_reason = reason
        rec.snapshot = None

    def assign(self, worker_id: str, decision_id: str, now: float) -> None:
        rec = self._record_of(worker_id)
        if rec is not None:
            rec.assignments[decision_id] = now
            rec.snapshot = None

    def on_outcome(self, worker_id: str, decision_id: str, failed: bool, now: float) -> None:
        rec = self._record_of(worker_id)
        if rec is None:
            return
        rec.assignments.pop(decision_id, None)
        if failed:
            rec.failures.append(now)
        rec.snapshot = None

    # --- output ---------------------------------------------------------------------------

    def snapshots(self, now: float) -> list[WorkerSnapshot]:
        """Every worker that has described itself, as the scheduler should see it now."""
        out = []
        for rec in self._by_address.values():
            if not rec.worker_id:
                continue
            self._expire(rec, now)
            if rec.snapshot is None or now - rec.snapshot_at > self._config.snapshot_max_age_s:
                rec.snapshot = self._build(rec, now)
                rec.snapshot_at = now
            out.append(rec.snapshot)
        return out

    def report_age_s(self, worker_id: str, now: float) -> float | None:
        rec = self._record_of(worker_id)
        return None if rec is None or rec.report is None else now - rec.report_at

    def last_report(self, worker_id: str) -> worker_pb2.LoadReport | None:
        rec = self._record_of(worker_id)
        return None if rec is None else rec.report

    # --- internals ------------------------------------------------------------------------

    def _record_of(self, worker_id: str) -> _Record | None:
        address = self._address_of.get(worker_id)
        return None if address is None else self._by_address.get(address)

    def _healthy(self, rec: _Record, now: float) -> bool:
        return (
            rec.connected
            and rec.report is not None
            and now - rec.report_at <= self._config.stale_after_s
        )

    def _expire(self, rec: _Record, now: float) -> None:
        ttl = self._config.assignment_ttl_s
        if rec.assignments and min(rec.assignments.values()) < now - ttl:
            rec.assignments = {d: t for d, t in rec.assignments.items() if t >= now - ttl}
            rec.snapshot = None
        window = self._config.failure_window_s
        while rec.failures and rec.failures[0] < now - window:
            rec.failures.popleft()
            rec.snapshot = None

    def _build(self, rec: _Record, now: float) -> WorkerSnapshot:
        healthy = self._healthy(rec, now)
        if healthy:
            detail = "ok"
        elif not rec.connected:
            detail = rec.down_reason or "disconnected"
        else:
            detail = f"no load report for {now - rec.report_at:.1f}s"
        report = rec.report
        lost = sum(1 for ok in rec.probes if not ok)
        loss = lost / len(rec.probes) if rec.probes else 0.0
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
            )
        gpu = max((g.utilization for g in report.gpus), default=None) if report.gpus else None
        return WorkerSnapshot(
            worker_id=rec.worker_id,
            region=rec.region,
            address=rec.address,
            healthy=healthy,
            health_detail=detail,
            models=tuple(
                ModelStatus(
                    name=m.name,
                    state=_STATE_FROM_PB.get(m.state, ModelState.FAILED),
                    max_model_len=m.max_model_len,
                )
                for m in report.models
            ),
            draining=report.draining,
            rtt_ms=rec.rtt_ms,
            loss=loss,
            report_age_s=now - rec.report_at,
            running=report.running,
            waiting=report.waiting,
            max_running=max(report.max_running, 1),
            kv_cache_usage=report.kv_cache_usage,
            tokens_per_second=report.tokens_per_second,
            prefix_cache_hit_rate=report.prefix_cache_hit_rate,
            gpu_utilization=gpu,
            in_flight=len(rec.assignments),
            recent_failures=len(rec.failures),
        )
