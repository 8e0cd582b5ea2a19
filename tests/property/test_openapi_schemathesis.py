"""schemathesis against a live edge with the OpenAPI description (deploy/openapi/edge.yaml):
generated valid and invalid requests, a real key, and these checks — no server error, every
status and content type documented, bodies and headers matching their schemas, invalid data
rejected, authentication not ignored, unsupported methods answered 405.

Not checked: "valid data accepted" — a schema-valid request may still name a model no worker
serves (404), or ask for more tokens than its context (400); that is the API's contract too.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.property.conftest import LiveEdge

if TYPE_CHECKING:  # schemathesis defines its OpenAPI case type for type checkers only
    from schemathesis.specs.openapi.schemas import OpenApiCase

SPEC = Path(__file__).resolve().parents[2] / "deploy/openapi/edge.yaml"
schema = schemathesis.openapi.from_path(SPEC)
# Invalid data may also be refused for its size (413) before it is parsed: that is a rejection.
schema.config.checks.negative_data_rejection.expected_statuses = [
    *schema.config.checks.negative_data_rejection.expected_statuses,
    "413",
]


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_the_edge_keeps_its_openapi_contract(case: OpenApiCase, live_edge: LiveEdge) -> None:
    case.call_and_validate(
        base_url=live_edge.base_url,
        headers={"Authorization": f"Bearer {live_edge.key}"},
        excluded_checks=[positive_data_acceptance],
        timeout=30,
    )
