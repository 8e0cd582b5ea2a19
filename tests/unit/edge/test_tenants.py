from __future__ import annotations

import pytest
from pydantic import ValidationError

from meridian.v1 import router_pb2
from services.edge.tenancy.tenants import Limits, Tenant, TenantPatch, Tier, valid_tenant_id


@pytest.mark.parametrize(
    ("tier", "priority"),
    [
        (Tier.LOW, router_pb2.PRIORITY_LOW),
        (Tier.STANDARD, router_pb2.PRIORITY_STANDARD),
        (Tier.HIGH, router_pb2.PRIORITY_HIGH),
    ],
)
def test_a_tier_is_a_router_priority(tier: Tier, priority: int) -> None:
    assert tier.priority() == priority


def test_limits_scale_to_a_replica_share_rounding_up_to_at_least_one() -> None:
    limits = Limits(rpm=10, tpm=1001, max_streams=1)
    assert limits.scaled(0.5) == Limits(rpm=5, tpm=501, max_streams=1)
    assert Limits().scaled(0.5) == Limits()
    assert Limits().unlimited()
    assert not limits.unlimited()


@pytest.mark.parametrize(
    "raw",
    [
        b'{"tenant_id": "acme", "limits": {"rpm": 0}}',
        b'{"tenant_id": "acme", "limits": {"rpm": "10"}}',
        b'{"tenant_id": "acme", "limits": {"rpm": 1.5}}',
        b'{"tenant_id": "acme", "limits": {"burst": 1}}',
        b'{"tenant_id": "acme", "tier": "gold"}',
        b'{"tenant_id": "ac me"}',
        b'{"tenant_id": "acme", "allowed_regions": [""]}',
        b'{"tenant_id": "acme", "surprise": true}',
        b'{"tier": "low"}',
    ],
)
def test_invalid_tenants_are_refused(raw: bytes) -> None:
    with pytest.raises(ValidationError):
        Tenant.model_validate_json(raw)


def test_a_tenant_round_trips_through_json() -> None:
    tenant = Tenant.model_validate_json(
        b'{"tenant_id": "acme", "tier": "high", "allowed_models": ["m1"],'
        b' "allowed_regions": ["kr", "jp"], "limits": {"rpm": 60, "tpm": 1000},'
        b' "key_limits": {"max_streams": 2}}'
    )
    assert Tenant.model_validate_json(tenant.model_dump_json()) == tenant
    assert tenant.allows_model("m1")
    assert not tenant.allows_model("m2")
    assert Tenant(tenant_id="any").allows_model("whatever")


def test_a_patch_changes_only_the_fields_it_names() -> None:
    tenant = Tenant(tenant_id="acme", tier=Tier.LOW, limits=Limits(rpm=5))
    patched = TenantPatch.model_validate_json(b'{"tier": "high", "disabled": true}').apply(tenant)
    assert (patched.tier, patched.disabled, patched.limits) == (Tier.HIGH, True, Limits(rpm=5))


def test_a_patch_of_one_limit_keeps_the_others() -> None:
    tenant = Tenant(
        tenant_id="acme",
        limits=Limits(rpm=5, tpm=1000, max_streams=2),
        key_limits=Limits(rpm=3),
    )
    patched = TenantPatch.model_validate_json(b'{"limits": {"tpm": 500}}').apply(tenant)
    assert patched.limits == Limits(rpm=5, tpm=500, max_streams=2)
    assert patched.key_limits == Limits(rpm=3)
    lifted = TenantPatch.model_validate_json(b'{"limits": {"rpm": null}}').apply(tenant)
    assert lifted.limits == Limits(rpm=None, tpm=1000, max_streams=2)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("acme", True),
        ("a.b_c-1", True),
        ("-acme", False),
        ("", False),
        ("a" * 65, False),
        ("acme\n", False),
    ],
)
def test_tenant_ids_are_short_plain_names(value: str, ok: bool) -> None:
    assert valid_tenant_id(value) is ok
