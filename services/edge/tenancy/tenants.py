"""Tenants: who a key belongs to, and what that tenant may do.

A tenant has a **tier** (the priority its requests carry to the router: low tier is shed
first under load), the **models** it may use (empty: all), the **regions** that may serve it
(data residency, a hard constraint the router enforces; empty: any), and **limits** — requests
per minute, tokens per minute and concurrent streams — for the tenant as a whole and for each
of its keys (a key may override its tenant's per-key limits). ``None`` means unlimited.

Stored in Redis as one JSON document per tenant (see :mod:`services.edge.tenancy.directory`);
the same pydantic models validate the admin API's input, so a stored tenant is always valid.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from pydantic_core import PydanticCustomError

from meridian.v1 import router_pb2

TENANT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_TENANT_RE = re.compile(TENANT_ID_PATTERN)

TenantId = Annotated[str, StringConstraints(pattern=TENANT_ID_PATTERN)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=256)]
#: Upper bounds that keep limits meaningful (and Lua's doubles exact).
MAX_RPM = 10_000_000
MAX_TPM = 10**12
MAX_STREAMS = 1_000_000


def valid_tenant_id(value: str) -> bool:
    return bool(_TENANT_RE.fullmatch(value))


class Tier(StrEnum):
    LOW = "low"
    STANDARD = "standard"
    HIGH = "high"

    def priority(self) -> router_pb2.Priority:
        return _PRIORITY[self]


_PRIORITY: dict[Tier, router_pb2.Priority] = {
    Tier.LOW: router_pb2.PRIORITY_LOW,
    Tier.STANDARD: router_pb2.PRIORITY_STANDARD,
    Tier.HIGH: router_pb2.PRIORITY_HIGH,
}


class Limits(BaseModel):
    """Per-minute request and token budgets and a concurrent-stream cap (None: unlimited)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    rpm: Annotated[int, Field(ge=1, le=MAX_RPM)] | None = None
    tpm: Annotated[int, Field(ge=1, le=MAX_TPM)] | None = None
    max_streams: Annotated[int, Field(ge=1, le=MAX_STREAMS)] | None = None

    def unlimited(self) -> bool:
        return self.rpm is None and self.tpm is None and self.max_streams is None

    def scaled(self, share: float) -> Limits:
        """This replica's part of each limit (rounded up, at least 1), for local fallback."""

        def part(v: int | None) -> int | None:
            return None if v is None else max(1, math.ceil(v * share))

        return Limits(rpm=part(self.rpm), tpm=part(self.tpm), max_streams=part(self.max_streams))


class Tenant(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    tenant_id: TenantId
    tier: Tier = Tier.STANDARD
    allowed_models: Annotated[tuple[Name, ...], Field(max_length=256)] = ()
    allowed_regions: Annotated[tuple[Name, ...], Field(max_length=256)] = ()
    limits: Limits = Limits()
    key_limits: Limits = Limits()
    disabled: bool = False
    created_ms: Annotated[int, Field(ge=0)] = 0

    def allows_model(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


class TenantPatch(BaseModel):
    """A partial update from the admin API: only the fields given change.

    ``None`` on a field means "not given" (left out of the body), never "set to null": every
    tenant field has a value, so an explicit ``null`` is refused as a 400 naming the field
    rather than reaching :meth:`apply`, where it would make an invalid tenant. (To lift a
    limit, send the limit's own ``null``: ``{"limits": {"rpm": null}}``.)"""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    tier: Tier | None = None
    allowed_models: Annotated[tuple[Name, ...], Field(max_length=256)] | None = None
    allowed_regions: Annotated[tuple[Name, ...], Field(max_length=256)] | None = None
    limits: Limits | None = None
    key_limits: Limits | None = None
    disabled: bool | None = None

    @field_validator("*", mode="after")
    @classmethod
    def _not_null(cls, value: object) -> object:
        # Every field, including any added later. After validation, not before: a "before"
        # validator would hand the inner (strict) one Python values, and a JSON array would
        # no longer pass as a tuple. Defaults (fields not given) are not validated at all.
        if value is None:
            raise PydanticCustomError(
                "null_field", "must not be null (leave the field out to keep its value)"
            )
        return value

    def apply(self, tenant: Tenant) -> Tenant:
        """The tenant with this patch's fields changed; a limits object is merged limit by
        limit (``{"limits": {"tpm": 500}}`` keeps the tenant's rpm and max_streams)."""
        merged = tenant.model_dump()
        for name, change in self.model_dump(exclude_unset=True).items():
            if isinstance(change, dict):  # exclude_unset holds: only the limits it names
                merged[name] = merged[name] | change
            else:
                merged[name] = change
        return Tenant.model_validate(merged, strict=False)
