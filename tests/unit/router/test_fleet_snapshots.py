"""The fleet's incremental view (unchanged rows keep their snapshot object; time alone
changes a row only at a deadline) and its folding of aliases (two addresses, one worker)."""

from __future__ import annotations

import pytest

from meridian.v1 import worker_pb2
from services.router.fleet import Fleet, FleetConfig
from services.router.scheduling.types import WorkerSnapshot
from services.router.service import _earliest


def report(worker_id: str, running: int = 0) -> worker_pb2.LoadReport:
    r = worker_pb2.LoadReport(worker_id=worker_id, region="kr", running=running, max_running=8)
    r.models.add(name="m", state=worker_pb2.MODEL_STATE_READY, max_model_len=4096)
    return r


def fleet(n: int, **cfg: float) -> Fleet:
    reg = Fleet(FleetConfig(**cfg))  # type: ignore[arg-type]
    for i in range(n):
        addr = f"10.0.0.{i}:7000"
        reg.add(addr)
        reg.on_describe(addr, worker_pb2.WorkerInfo(worker_id=f"w{i}", region="kr"))
        reg.on_report(addr, report(f"w{i}"), now=1.0)
    return reg


def by_id(snaps: list[WorkerSnapshot]) -> dict[str, WorkerSnapshot]:
    return {s.worker_id: s for s in snaps}


def test_only_the_rows_that_changed_get_new_snapshot_objects() -> None:
    reg = fleet(4)
    first = reg.snapshots(1.0)
    reg.assign("w2", "d1", now=1.01)
    second = reg.snapshots(1.01)
    assert [a is b for a, b in zip(first, second, strict=True)] == [True, True, False, True]
    assert by_id(second)["w2"].in_flight == 1


def test_the_list_handed_out_is_a_copy_each_time() -> None:
    reg = fleet(2)
    a = reg.snapshots(1.0)
    a.clear()
    assert len(reg.snapshots(1.0)) == 2


@pytest.mark.parametrize(
    ("what", "at", "healthy", "in_flight", "failures"),
    [
        ("before any deadline", 1.5, True, 1, 1),
        ("report goes stale at 1.0 + 0.6", 1.7, False, 1, 1),
        ("failure leaves its 2 s window", 3.2, False, 1, 0),
        ("assignment expires after its 5 s ttl", 6.2, False, 0, 0),
    ],
)
def test_time_alone_changes_a_row_at_its_deadlines(
    what: str, at: float, healthy: bool, in_flight: int, failures: int
) -> None:
    reg = fleet(1, stale_after_s=0.6, failure_window_s=2.0, assignment_ttl_s=5.0)
    reg.assign("w0", "d1", now=1.1)
    reg.assign("w0", "d2", now=1.1)
    reg.on_outcome("w0", "d2", failed=True, now=1.1)
    reg.snapshots(1.1)
    (snap,) = reg.snapshots(at)
    assert (snap.healthy, snap.in_flight, snap.recent_failures) == (healthy, in_flight, failures)


def test_a_row_is_rebuilt_after_snapshot_max_age_even_without_a_deadline() -> None:
    reg = fleet(1, snapshot_max_age_s=0.2, stale_after_s=10.0)
    (a,) = reg.snapshots(1.0)
    (b,) = reg.snapshots(1.1)
    (c,) = reg.snapshots(1.3)
    assert a is b
    assert c is not a
    assert c.report_age_s == pytest.approx(0.3)


def test_a_second_address_of_the_same_worker_is_listed_once() -> None:
    reg = fleet(1)
    reg.add("127.0.0.1:7000")
    reg.on_describe("127.0.0.1:7000", worker_pb2.WorkerInfo(worker_id="w0", region="kr"))
    reg.on_report("127.0.0.1:7000", report("w0"), now=1.0)
    (snap,) = reg.snapshots(1.0)
    assert snap.address == "10.0.0.0:7000"  # the first to describe it


def test_an_alias_takes_over_when_the_listed_address_loses_its_connection() -> None:
    reg = fleet(1)
    reg.add("127.0.0.1:7000")
    reg.on_describe("127.0.0.1:7000", worker_pb2.WorkerInfo(worker_id="w0", region="kr"))
    reg.on_report("127.0.0.1:7000", report("w0"), now=1.0)
    reg.on_disconnect("10.0.0.0:7000", "UNAVAILABLE: gone")
    (snap,) = reg.snapshots(1.1)
    assert (snap.address, snap.healthy) == ("127.0.0.1:7000", True)
    reg.assign("w0", "d1", now=1.1)
    assert reg.snapshots(1.1)[0].in_flight == 1


def test_removing_the_listed_address_promotes_the_alias() -> None:
    reg = fleet(1)
    reg.add("127.0.0.1:7000")
    reg.on_describe("127.0.0.1:7000", worker_pb2.WorkerInfo(worker_id="w0", region="kr"))
    reg.on_report("127.0.0.1:7000", report("w0"), now=1.0)
    reg.remove("10.0.0.0:7000")
    (snap,) = reg.snapshots(1.0)
    assert snap.address == "127.0.0.1:7000"
    assert reg.address_of("w0") == "127.0.0.1:7000"


def test_a_restarted_worker_with_a_new_id_replaces_the_old_row() -> None:
    reg = fleet(2)
    reg.on_describe("10.0.0.1:7000", worker_pb2.WorkerInfo(worker_id="w9", region="jp"))
    reg.on_report("10.0.0.1:7000", report("w9"), now=1.2)
    snaps = by_id(reg.snapshots(1.2))
    assert set(snaps) == {"w0", "w9"}
    assert snaps["w9"].region == "kr"  # the report's region wins over the describe's
    assert reg.address_of("w1") is None


def test_membership_changes_keep_the_other_rows_objects() -> None:
    reg = fleet(3)
    before = by_id(reg.snapshots(1.0))
    reg.remove("10.0.0.1:7000")
    after = by_id(reg.snapshots(1.0))
    assert set(after) == {"w0", "w2"}
    assert after["w0"] is before["w0"]
    assert after["w2"] is before["w2"]


def test_packet_loss_is_counted_over_a_sliding_window() -> None:
    reg = fleet(1, loss_window=3)
    for rtt in (None, None, 5.0, 5.0, 5.0):
        reg.on_probe("10.0.0.0:7000", rtt)
    assert reg.snapshots(1.0)[0].loss == 0.0
    reg.on_probe("10.0.0.0:7000", None)
    assert reg.snapshots(1.0)[0].loss == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("report_at", "in_flight"),
    [
        (1.030, 1),  # sent before the request could have reached the worker
        (1.059, 1),  # 1.000 + rtt 0.040 + grace 0.020 = 1.060: not yet
        (1.061, 0),  # this report was sent after the request arrived
    ],
)
def test_a_report_covers_an_assignment_one_rtt_and_the_grace_after_it(
    report_at: float, in_flight: int
) -> None:
    reg = fleet(1, in_flight_grace_s=0.02)
    reg.on_probe("10.0.0.0:7000", 40.0)
    reg.assign("w0", "d1", now=1.0)
    reg.on_report("10.0.0.0:7000", report("w0"), now=report_at)
    assert reg.snapshots(report_at)[0].in_flight == in_flight


def test_a_models_ready_time_reaches_the_snapshot_and_the_earliest_worker_wins() -> None:
    reg = fleet(2)
    for i, created in enumerate((1_700_000_300, 1_700_000_100)):
        r = report(f"w{i}")
        r.models[0].created_unix_s = created
        reg.on_report(f"10.0.0.{i}:7000", r, now=1.1)
    snaps = by_id(reg.snapshots(1.1))
    assert [snaps[w].models[0].created_unix_s for w in ("w0", "w1")] == [
        1_700_000_300,
        1_700_000_100,
    ]
    # What ListModels answers for the model: the earlier; a worker that does not say (0) is
    # no earlier than one that does.
    assert _earliest(1_700_000_300, 1_700_000_100) == 1_700_000_100
    assert _earliest(0, 1_700_000_100) == _earliest(1_700_000_100, 0) == 1_700_000_100
