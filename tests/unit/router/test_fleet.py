from collections.abc import Callable

import pytest

from meridian.v1 import worker_pb2
from services.router.fleet import Fleet, FleetConfig
from services.router.scheduling.types import ModelState

ADDR = "127.0.0.1:5000"


def report(running: int = 0, waiting: int = 0, draining: bool = False) -> worker_pb2.LoadReport:
    r = worker_pb2.LoadReport(
        worker_id="kr-1",
        region="kr",
        running=running,
        waiting=waiting,
        max_running=8,
        kv_cache_usage=0.25,
        draining=draining,
    )
    r.models.add(name="m", state=worker_pb2.MODEL_STATE_READY, max_model_len=4096)
    return r


def fleet(stalled_since: Callable[[float], float] | None = None, **cfg: float) -> Fleet:
    config = FleetConfig(snapshot_max_age_s=0.0, **cfg)  # type: ignore[arg-type]
    reg = Fleet(config, stalled_since=stalled_since)
    reg.add(ADDR)
    reg.on_describe(ADDR, worker_pb2.WorkerInfo(worker_id="kr-1", region="kr"))
    return reg


def only(reg: Fleet, now: float):  # type: ignore[no-untyped-def]
    (snap,) = reg.snapshots(now)
    return snap


def test_a_described_worker_without_reports_is_not_healthy() -> None:
    snap = only(fleet(), 0.0)
    assert not snap.healthy
    assert snap.health_detail == "not connected yet"


def test_a_reporting_worker_is_healthy_with_its_load() -> None:
    reg = fleet()
    reg.on_report(ADDR, report(running=3, waiting=2), now=10.0)
    snap = only(reg, 10.1)
    assert snap.healthy
    assert (snap.running, snap.waiting, snap.max_running) == (3, 2, 8)
    assert snap.models[0].state is ModelState.READY
    assert snap.kv_cache_usage == 0.25


def test_a_worker_goes_stale_when_reports_stop() -> None:
    reg = fleet(stale_after_s=0.5)
    reg.on_report(ADDR, report(), now=10.0)
    assert only(reg, 10.4).healthy
    stale = only(reg, 10.6)
    assert not stale.healthy
    assert "no load report" in stale.health_detail


def test_the_routers_own_stall_does_not_age_a_workers_reports() -> None:
    stalls = {10.0: 0.0}
    reg = fleet(stalled_since=lambda since: stalls[since], stale_after_s=0.5)
    reg.on_report(ADDR, report(), now=10.0)
    stalls[10.0] = 1.2  # the router's loop could not run: a GC pass, a throttled CPU
    resumed = only(reg, 11.4)
    assert resumed.healthy  # 1.4 s since the report, 0.2 s of it listening
    assert resumed.report_age_s == pytest.approx(0.2)
    stale = only(reg, 11.8)  # 0.6 s of listening without a report: down after all
    assert not stale.healthy
    assert "no load report for 0.6s" in stale.health_detail


def test_a_disconnect_marks_the_worker_down_at_once() -> None:
    reg = fleet()
    reg.on_report(ADDR, report(), now=10.0)
    reg.on_disconnect(ADDR, "UNAVAILABLE: connection reset")
    snap = only(reg, 10.0)
    assert not snap.healthy
    assert "connection reset" in snap.health_detail


def test_rtt_is_the_minimum_of_recent_probes_and_loss_is_counted() -> None:
    reg = fleet(rtt_window=3, loss_window=4)
    reg.on_report(ADDR, report(), now=1.0)
    reg.on_probe(ADDR, 10.0)
    reg.on_probe(ADDR, 20.0)
    reg.on_probe(ADDR, None)
    reg.on_probe(ADDR, 20.0)
    snap = only(reg, 1.0)
    assert snap.rtt_ms == pytest.approx(10.0)  # a delayed probe is not distance
    assert snap.loss == pytest.approx(0.25)


def test_a_lasting_rise_in_rtt_shows_once_the_window_has_seen_it() -> None:
    reg = fleet(rtt_window=3)
    reg.on_report(ADDR, report(), now=1.0)
    seen = []
    for rtt in (2.0, 2.0, 40.0, 41.0, 40.0, 42.0, 1.5):
        reg.on_probe(ADDR, rtt)
        seen.append(only(reg, 1.0).rtt_ms)
    assert seen == [2.0, 2.0, 2.0, 2.0, 40.0, 40.0, 1.5]  # a fall shows at once


def test_assignments_count_as_in_flight_until_a_report_covers_them() -> None:
    reg = fleet()
    reg.on_report(ADDR, report(), now=1.0)
    reg.assign("kr-1", "d1", now=1.01)
    reg.assign("kr-1", "d2", now=1.02)
    assert only(reg, 1.03).in_flight == 2
    reg.on_report(ADDR, report(running=2), now=1.10)  # sent after both arrived
    assert only(reg, 1.11).in_flight == 0


def test_outcomes_release_in_flight_and_count_failures() -> None:
    reg = fleet(failure_window_s=5.0)
    reg.on_report(ADDR, report(), now=1.0)
    reg.assign("kr-1", "d1", now=1.0)
    reg.on_outcome("kr-1", "d1", failed=True, now=1.1)
    snap = only(reg, 1.2)
    assert snap.in_flight == 0
    assert snap.recent_failures == 1
    assert snap.failures_clear_in_s == pytest.approx((4.9,))  # 1.1 + 5 - 1.2
    later = only(reg, 7.0)
    assert later.recent_failures == 0
    assert later.failures_clear_in_s == ()


def test_draining_is_visible() -> None:
    reg = fleet()
    reg.on_report(ADDR, report(draining=True), now=1.0)
    assert only(reg, 1.0).draining


def test_removed_workers_disappear() -> None:
    reg = fleet()
    reg.on_report(ADDR, report(), now=1.0)
    reg.remove(ADDR)
    assert reg.snapshots(1.0) == []


@pytest.mark.parametrize(
    "kwargs",
    [{"stale_after_s": 0}, {"rtt_window": 0}, {"loss_window": 0}],
)
def test_bad_fleet_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        FleetConfig(**kwargs)  # type: ignore[arg-type]


def test_admitted_decision_ids_release_exactly_those_assignments() -> None:
    reg = fleet(admission_timeout_s=2.0)
    reg.on_report(ADDR, report(), now=1.0)
    for d in ("d1", "d2", "d3"):
        reg.assign("kr-1", d, now=1.01)
    r = report(running=2)
    r.reports_admissions = True
    r.admitted_decision_ids.extend(["d1", "d3"])
    reg.on_report(ADDR, r, now=1.02)  # well inside any timing grace: ids decide
    assert only(reg, 1.02).in_flight == 1
    quiet = report(running=2)
    quiet.reports_admissions = True
    reg.on_report(ADDR, quiet, now=2.5)
    assert only(reg, 2.5).in_flight == 1  # d2 not named yet, still counted
    reg.on_report(ADDR, quiet, now=3.5)
    assert only(reg, 3.5).in_flight == 0  # never admitted here: dropped after the timeout


def test_a_worker_is_shared_while_its_admissions_name_another_routers_requests() -> None:
    """Decision ids carry the router's prefix: a worker whose admission lists named only this
    router's requests (or none yet) is its alone (in-flight exact); one whose last list named
    another replica's or the edge's own is shared; a list-less report cannot tell, so it is
    shared too, until a list names requests again."""
    reg = Fleet(FleetConfig(snapshot_max_age_s=0.0), id_prefix="me-")
    reg.add(ADDR)
    reg.on_describe(ADDR, worker_pb2.WorkerInfo(worker_id="kr-1", region="kr"))

    def admitting(*ids: str) -> worker_pb2.LoadReport:
        r = report(running=len(ids))
        r.reports_admissions = True
        r.admitted_decision_ids.extend(ids)
        return r

    reg.on_report(ADDR, admitting(), now=1.0)
    assert not only(reg, 1.0).shared  # nothing named yet: no one else's request has arrived
    reg.on_report(ADDR, admitting("me-1", "me-2"), now=1.5)
    assert not only(reg, 1.5).shared
    reg.on_report(ADDR, admitting(), now=2.0)
    assert not only(reg, 2.0).shared  # an empty list changes nothing
    reg.on_report(ADDR, admitting("me-3", "ab12cd-7"), now=2.5)
    assert only(reg, 2.5).shared  # another replica's
    reg.on_report(ADDR, admitting("me-4"), now=3.0)
    assert not only(reg, 3.0).shared
    reg.on_report(ADDR, admitting("local-9f8e"), now=3.5)
    assert only(reg, 3.5).shared  # an edge that decided on its own
    reg.on_report(ADDR, admitting("me-5"), now=4.0)
    reg.on_report(ADDR, report(running=1), now=4.5)
    assert only(reg, 4.5).shared  # no lists at all: cannot tell
    reg.on_report(ADDR, admitting(), now=5.0)
    assert only(reg, 5.0).shared  # lists again, nothing named yet: still cannot tell
    assert Fleet().id_prefix != Fleet().id_prefix  # random per router process


def admissions(running: int, *ids: str) -> worker_pb2.LoadReport:
    r = report(running=running)
    r.reports_admissions = True
    r.admitted_decision_ids.extend(ids)
    return r


def test_requests_that_ended_since_the_last_report_do_not_count_as_running() -> None:
    """Closed-loop clients whose streams all end together send their next requests at once:
    the last report still counts the ended ones, the new ones are in flight on top."""
    reg = fleet(admission_timeout_s=2.0)
    reg.on_report(ADDR, report(), now=1.0)
    for i in range(6):
        reg.assign("kr-1", f"d{i}", now=1.01)
    reg.on_report(ADDR, admissions(6, *(f"d{i}" for i in range(6))), now=1.02)
    assert (only(reg, 1.02).running, only(reg, 1.02).in_flight) == (6, 0)
    for i in range(6):
        reg.on_outcome("kr-1", f"d{i}", failed=False, now=1.05)
    for i in range(6, 12):
        reg.assign("kr-1", f"d{i}", now=1.05)
    snap = only(reg, 1.06)
    assert (snap.running, snap.in_flight) == (0, 6)  # before: 6 running + 6 in flight
    # The next report is the worker's own count again: the new six, admitted.
    reg.on_report(ADDR, admissions(6, *(f"d{i}" for i in range(6, 12))), now=1.12)
    snap = only(reg, 1.12)
    assert (snap.running, snap.in_flight) == (6, 0)


def test_an_outcome_for_a_request_no_report_counted_yet_does_not_lower_running() -> None:
    reg = fleet(admission_timeout_s=2.0)
    reg.on_report(ADDR, admissions(3), now=1.0)  # three of another router's requests
    reg.assign("kr-1", "mine", now=1.01)
    reg.on_outcome("kr-1", "mine", failed=True, now=1.02)  # ended before any report named it
    snap = only(reg, 1.03)
    assert (snap.running, snap.in_flight) == (3, 0)
    reg.on_outcome("kr-1", "unknown", failed=False, now=1.04)
    assert only(reg, 1.04).running == 3
