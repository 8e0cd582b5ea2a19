"""Every filter, as tables of inline worker rows → kept ids / rejection reasons."""

from __future__ import annotations

import pytest

from services.router.scheduling.filters.admission import AdmissionFilter, TierThresholds
from services.router.scheduling.filters.draining import NotDrainingFilter
from services.router.scheduling.filters.ejection import FailureEjectionFilter
from services.router.scheduling.filters.exclude import ExcludeFilter
from services.router.scheduling.filters.healthy import HealthyFilter
from services.router.scheduling.filters.model import ModelReadyFilter
from services.router.scheduling.filters.reserve import TierReserveFilter
from services.router.scheduling.filters.residency import ResidencyFilter
from services.router.scheduling.filters.stale import FreshReportFilter
from services.router.scheduling.params import ParamError
from services.router.scheduling.plugin import Filter
from services.router.scheduling.types import (
    ModelState,
    ModelStatus,
    NoCandidate,
    Priority,
    RouteQuery,
    WorkerSnapshot,
)
from tests.support.builders import q, w


def run(
    f: Filter, query: RouteQuery, rows: list[WorkerSnapshot]
) -> tuple[list[str], dict[str, str]]:
    kept, rejected = f.filter(query, rows)
    assert all(r.filter == f.TYPE for r in rejected)
    return [k.worker_id for k in kept], {r.worker_id: r.reason for r in rejected}


@pytest.mark.parametrize(
    ("rows", "kept", "reasons"),
    [
        ([w("a"), w("b")], ["a", "b"], {}),
        (
            [
                w("a"),
                w("b", models=(ModelStatus("m", ModelState.LOADING),)),
                w("c", models=(ModelStatus("m", ModelState.DRAINING),)),
                w("d", models=(ModelStatus("m", ModelState.FAILED),)),
                w("e", models=(ModelStatus("other", ModelState.READY),)),
                w("f", models=()),
            ],
            ["a"],
            {
                "b": "model 'm' is loading",
                "c": "model 'm' is draining",
                "d": "model 'm' is failed",
                "e": "does not serve model 'm'",
                "f": "does not serve model 'm'",
            },
        ),
    ],
)
def test_model_ready_keeps_only_workers_with_the_model_ready(
    rows: list[WorkerSnapshot], kept: list[str], reasons: dict[str, str]
) -> None:
    assert run(ModelReadyFilter(), q(), rows) == (kept, reasons)


@pytest.mark.parametrize(
    ("allowed", "kept", "rejected"),
    [
        (frozenset(), ["eu1", "us1", "ap1"], []),
        (frozenset({"eu"}), ["eu1"], ["us1", "ap1"]),
        (frozenset({"eu", "ap"}), ["eu1", "ap1"], ["us1"]),
        (frozenset({"mars"}), [], ["eu1", "us1", "ap1"]),
    ],
)
def test_residency_never_lets_a_worker_outside_allowed_regions_through(
    allowed: frozenset[str], kept: list[str], rejected: list[str]
) -> None:
    rows = [w("eu1", region="eu"), w("us1", region="us"), w("ap1", region="ap")]
    got_kept, reasons = run(ResidencyFilter(), q(allowed_regions=allowed), rows)
    assert got_kept == kept
    assert sorted(reasons) == sorted(rejected)
    for worker_id, reason in reasons.items():
        assert "not in (" in reason, worker_id


def test_residency_reason_names_the_region_and_the_allowed_set() -> None:
    _, reasons = run(
        ResidencyFilter(), q(allowed_regions=frozenset({"eu", "ch"})), [w("x", region="us")]
    )
    assert reasons == {"x": "region 'us' not in (ch, eu)"}


@pytest.mark.parametrize(
    ("rows", "kept", "reasons"),
    [
        (
            [w("a"), w("b", healthy=False, health_detail="no load report for 1.2s")],
            ["a"],
            {"b": "unhealthy: no load report for 1.2s"},
        ),
        (
            [w("a", healthy=False, health_detail="stream closed")],
            [],
            {"a": "unhealthy: stream closed"},
        ),
    ],
)
def test_healthy_rejects_workers_the_fleet_marked_down(
    rows: list[WorkerSnapshot], kept: list[str], reasons: dict[str, str]
) -> None:
    assert run(HealthyFilter(), q(), rows) == (kept, reasons)


def test_not_draining_rejects_draining_workers() -> None:
    assert run(NotDrainingFilter(), q(), [w("a"), w("b", draining=True)]) == (
        ["a"],
        {"b": "draining"},
    )


@pytest.mark.parametrize(
    ("max_age_s", "ages", "kept"),
    [
        (3.0, {"a": 0.0, "b": 2.9, "c": 3.0, "d": 3.1}, ["a", "b", "c"]),
        (0.5, {"a": 0.4, "b": 0.6}, ["a"]),
    ],
)
def test_fresh_report_rejects_reports_older_than_max_age(
    max_age_s: float, ages: dict[str, float], kept: list[str]
) -> None:
    rows = [w(i, report_age_s=a) for i, a in ages.items()]
    got, reasons = run(FreshReportFilter(max_age_s=max_age_s), q(), rows)
    assert got == kept
    for worker_id, reason in reasons.items():
        assert reason.startswith(f"no load report for {ages[worker_id]:.1f}s"), reason


@pytest.mark.parametrize(
    ("max_failures", "failures", "kept"),
    [
        (3, {"a": 0, "b": 2, "c": 3, "d": 9}, ["a", "b"]),
        (1, {"a": 0, "b": 1}, ["a"]),
    ],
)
def test_failure_ejection_ejects_after_n_recent_failures(
    max_failures: int, failures: dict[str, int], kept: list[str]
) -> None:
    rows = [w(i, recent_failures=n) for i, n in failures.items()]
    got, reasons = run(FailureEjectionFilter(max_failures=max_failures), q(), rows)
    assert got == kept
    assert all(r.startswith("ejected: ") for r in reasons.values())


def test_exclude_leaves_out_workers_already_tried_and_is_free_without_them() -> None:
    rows = [w("a"), w("b"), w("c")]
    kept, rejected = ExcludeFilter().filter(q(), rows)
    assert kept is rows
    assert rejected == []
    assert run(ExcludeFilter(), q(exclude_worker_ids=frozenset({"b", "zz"})), rows) == (
        ["a", "c"],
        {"b": "already tried for this request"},
    )


def loaded(
    worker_id: str, running: int, *, kv: float = 0.0, region: str = "eu", **kw: object
) -> WorkerSnapshot:
    """A worker with 100 batch slots, ``running`` of them taken."""
    return w(worker_id, region=region, running=running, max_running=100, kv_cache_usage=kv, **kw)


@pytest.mark.parametrize(
    ("priority", "kept"),
    [
        # loads: a 0.50, b 0.95, c 0.97, d 0.98, e 0.995, f 1.00, g 1.20 (queueing)
        (Priority.LOW, ["a"]),
        (Priority.STANDARD, ["a", "b", "c"]),
        (Priority.HIGH, ["a", "b", "c", "d", "e"]),
    ],
)
def test_admission_sheds_lowest_priority_first(priority: Priority, kept: list[str]) -> None:
    rows = [
        loaded("a", 50),
        loaded("b", 95),
        loaded("c", 97),
        loaded("d", 98),
        loaded("e", 99, kv=0.995),
        loaded("f", 100),
        loaded("g", 100, waiting=20),
    ]
    got, reasons = run(AdmissionFilter(), q(priority=priority), rows)
    assert got == kept
    assert all(f"refuses {priority.name} at load" in r for r in reasons.values())


@pytest.mark.parametrize(
    ("row", "refused_for_standard"),
    [
        (loaded("slots", 98), True),  # batch slots
        (loaded("queue", 90, waiting=8), True),  # queued requests count as occupied
        (loaded("inflight", 90, in_flight=8), True),  # so do requests sent since the report
        (loaded("kv", 10, kv=0.99), True),  # a full KV cache, whatever the slots say
        (loaded("gpu", 10, gpu_utilization=1.0), False),  # GPU busy is not GPU full
        (loaded("fine", 90, waiting=7, kv=0.97), False),
    ],
)
def test_admission_load_is_the_tightest_of_slots_and_kv_cache(
    row: WorkerSnapshot, refused_for_standard: bool
) -> None:
    got, _ = run(AdmissionFilter(), q(priority=Priority.STANDARD), [row])
    assert (got == []) is refused_for_standard


def test_admission_can_fold_gpu_use_into_load() -> None:
    row = loaded("gpu", 10, gpu_utilization=0.99)
    got, reasons = run(AdmissionFilter(include_gpu=True), q(), [row])
    assert got == []
    assert "gpu=0.99" in reasons["gpu"]


def test_admission_uses_per_region_thresholds_over_global_ones() -> None:
    f = AdmissionFilter(regions={"ap": TierThresholds(low=0.5, standard=0.6, high=0.7)})
    rows = [loaded("eu-a", 65, region="eu"), loaded("ap-a", 65, region="ap")]
    assert run(f, q(priority=Priority.STANDARD), rows)[0] == ["eu-a"]
    assert run(f, q(priority=Priority.HIGH), rows)[0] == ["eu-a", "ap-a"]


def test_admission_reason_quotes_load_threshold_and_inputs() -> None:
    _, reasons = run(AdmissionFilter(), q(priority=Priority.LOW), [loaded("b", 95, kv=0.5)])
    assert reasons == {"b": "refuses LOW at load 0.95 >= 0.95 (slots=95+0+0/100 kv=0.50)"}


def test_admission_is_the_filter_that_reports_saturation_and_its_retry_hint() -> None:
    f = AdmissionFilter(retry_after_s=2.5)
    assert f.EMPTY_REASON is NoCandidate.SATURATED
    assert f.retry_hint_s() == 2.5


@pytest.mark.parametrize(
    ("build", "path"),
    [
        (lambda: TierThresholds(low=0.99, standard=0.98), ""),
        (lambda: TierThresholds(high=0), "high"),
        (lambda: AdmissionFilter(retry_after_s=-1), "retry_after_s"),
        (lambda: FreshReportFilter(max_age_s=0), "max_age_s"),
        (lambda: FailureEjectionFilter(max_failures=0), "max_failures"),
    ],
)
def test_filter_parameters_are_validated_at_construction(build: object, path: str) -> None:
    with pytest.raises(ParamError) as err:
        build()  # type: ignore[operator]
    assert err.value.path == path


@pytest.mark.parametrize(
    ("priority", "kept"),
    [
        (Priority.LOW, ["free3"]),
        (Priority.STANDARD, ["free2", "free3"]),
        (Priority.HIGH, ["free1", "free2", "free3"]),
    ],
)
def test_tier_reserve_keeps_the_last_slots_for_the_tiers_above(
    priority: Priority, kept: list[str]
) -> None:
    rows = [
        w("full", running=6, waiting=1, in_flight=1, max_running=8),
        w("free1", running=7, max_running=8),
        w("free2", running=5, in_flight=1, max_running=8),
        w("free3", running=5, max_running=8),
    ]
    f = TierReserveFilter(low=2, standard=1, high=0)
    survivors, rejected = f.filter(q(priority=priority), rows)
    assert [s.worker_id for s in survivors] == kept
    assert all("slots=" in r.reason for r in rejected)
    assert f.EMPTY_REASON is NoCandidate.SATURATED


def test_tier_reserve_refuses_a_lower_tier_with_more_room() -> None:
    with pytest.raises(ParamError, match="low >= standard >= high"):
        TierReserveFilter(low=0, standard=1, high=0)
