"""A Route request crossed the network: every field is bounded before anything keeps it."""

from __future__ import annotations

import pytest

from meridian.v1 import router_pb2
from services.common.errors import InvalidRequest
from services.router.service import MAX_NAME_CHARS, outcome_problem, query_from_pb

LONG = "x" * (MAX_NAME_CHARS + 1)


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"tenant_id": LONG}, "tenant_id", "tenant_id is longer than 256 characters"),
        ({"session_id": LONG}, "session_id", "session_id is longer"),
        ({"edge_site": LONG}, "edge_site", "edge_site is longer"),
        ({"client_region": LONG}, "client_region", "client_region is longer"),
        ({"allowed_regions": ["kr", LONG]}, "allowed_regions", "a name of 1..256 characters"),
        ({"allowed_regions": [""]}, "allowed_regions", "a name of 1..256 characters"),
        ({"exclude_worker_ids": [LONG]}, "exclude_worker_ids", "a name of 1..256 characters"),
        ({"priority": 77}, "priority", "unknown priority 77"),
        ({"model": ""}, "model", "model is required"),
        ({"model": "m" * 257}, "model", "model is longer than"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_an_unbounded_or_unknown_field_is_refused_naming_it(
    fields: dict[str, object], param: str, message: str
) -> None:
    pb = router_pb2.RouteRequest(request_id="r", model="m")
    for key, value in fields.items():
        if isinstance(value, list):
            getattr(pb, key).extend(value)
        else:
            setattr(pb, key, value)
    with pytest.raises(InvalidRequest) as exc:
        query_from_pb(pb)
    assert exc.value.param == param
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"decision_id": ""}, "decision_id"),
        ({"decision_id": "d" * 10_000}, "decision_id"),
        ({"worker_id": ""}, "worker_id"),
        ({"worker_id": LONG}, "worker_id"),
        ({"outcome": 99}, "outcome"),
        ({"outcome": router_pb2.OUTCOME_UNSPECIFIED}, "outcome"),
        ({"ttft_ms": float("nan")}, "ttft_ms"),
        ({"ttft_ms": -1.0}, "ttft_ms"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_malformed_outcome_report_is_named_by_its_field(
    fields: dict[str, object], problem: str
) -> None:
    good = {"decision_id": "d1", "worker_id": "kr-1", "outcome": router_pb2.OUTCOME_SUCCESS}
    assert outcome_problem(router_pb2.OutcomeReport(**good)) is None  # type: ignore[arg-type]
    found = outcome_problem(router_pb2.OutcomeReport(**{**good, **fields}))  # type: ignore[arg-type]
    assert found is not None
    assert found[0] == problem


def test_names_at_the_limit_are_accepted() -> None:
    edge = "e" * MAX_NAME_CHARS
    pb = router_pb2.RouteRequest(request_id="r", model="m", edge_site=edge, tenant_id=edge)
    pb.allowed_regions.append(edge)
    assert query_from_pb(pb).edge_site == edge
