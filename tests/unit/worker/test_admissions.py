import pytest

from services.worker.admissions import AdmissionLog


def test_each_stream_gets_the_ids_admitted_since_its_cursor() -> None:
    log = AdmissionLog()
    start = log.last_seq
    log.admitted("d1")
    log.admitted("d2")
    assert log.since(start) == ["d1", "d2"]
    cursor = log.last_seq
    log.admitted("d3")
    assert log.since(cursor) == ["d3"]
    assert log.since(log.last_seq) == []


def test_requests_without_a_decision_are_not_logged() -> None:
    log = AdmissionLog()
    log.admitted("")
    assert log.since(0) == []
    assert log.last_seq == 0


def test_a_report_carries_at_most_the_newest_ids() -> None:
    log = AdmissionLog(max_entries=10, max_per_report=3)
    for i in range(8):
        log.admitted(f"d{i}")
    assert log.since(0) == ["d5", "d6", "d7"]


def test_the_log_is_bounded() -> None:
    log = AdmissionLog(max_entries=4, max_per_report=100)
    for i in range(10):
        log.admitted(f"d{i}")
    assert log.since(0) == ["d6", "d7", "d8", "d9"]


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        AdmissionLog(max_entries=0)
