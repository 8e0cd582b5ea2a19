"""A Route request crossed the network: every field is bounded before anything keeps it."""

from __future__ import annotations

import pytest

from meridian.v1 import router_pb2
from services.common.errors import InvalidRequest
from services.router.service import MAX_NAME_CHARS, query_from_pb

LONG = "x" * (MAX_NAME_CHARS + 1)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tenant_id": LONG}, "tenant_id"),
        ({"session_id": LONG}, "session_id"),
        ({"edge_site": LONG}, "edge_site"),
        ({"client_region": LONG}, "client_region"),
        ({"allowed_regions": ["kr", LONG]}, "allowed_regions"),
        ({"exclude_worker_ids": [LONG]}, "exclude_worker_ids"),
        ({"priority": 77}, "priority"),
        ({"model": ""}, "model"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_an_unbounded_or_unknown_field_is_refused_naming_it(
    fields: dict[str, object], param: str
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


def test_names_at_the_limit_are_accepted() -> None:
    edge = "e" * MAX_NAME_CHARS
    pb = router_pb2.RouteRequest(request_id="r", model="m", edge_site=edge, tenant_id=edge)
    pb.allowed_regions.append(edge)
    assert query_from_pb(pb).edge_site == edge
