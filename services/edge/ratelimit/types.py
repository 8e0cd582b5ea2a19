"""What the limiter is asked (an :class:`Ask`) and what it answers (a :class:`Verdict`).

The algorithm, shared by both backends: for each scope (the key, its tenant) a **sliding
window log** of the last ``window_ms`` of admitted requests, each entry carrying the tokens
*reserved* for it, plus a set of **stream leases**. A request is admitted only if, in *every*
scope,

- requests in the window + 1 <= rpm,
- tokens in the window + this request's reservation <= tpm,
- live leases + 1 <= max_streams,

and then it is recorded in every scope at once (check all, then write all). When the request
ends, its entry is *settled*: the reservation is replaced by the tokens really used, and its
lease removed. Leases expire ``lease_ms`` after admission unless renewed, so an edge that
crashes cannot hold slots forever. A sliding log is exact: at no instant do the admitted
requests of the last minute exceed the limit (tokens: unless a request used more than it
reserved, which is then charged in full).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from services.edge.tenancy.tenants import Limits


class Reason(StrEnum):
    REQUESTS = "requests"
    TOKENS = "tokens"
    STREAMS = "streams"
    TOO_LARGE = "too_large"  # the reservation alone is over tpm: retrying cannot help


@dataclass(frozen=True, slots=True)
class Scope:
    kind: str  # "key" | "tenant": what the client is told
    name: str  # key id or tenant id: what the client is told
    id: str  # the backend's name for this scope's state
    limits: Limits


@dataclass(frozen=True, slots=True)
class Ask:
    request_id: str
    tokens: int  # the reservation: prompt estimate + max_tokens (else min_tokens or a default)
    scopes: tuple[Scope, ...]


@dataclass(frozen=True, slots=True)
class ScopeState:
    """One scope after the decision (after admission if admitted)."""

    requests: int  # in the window
    tokens: int  # reserved or used, in the window
    streams: int  # live leases
    reset_ms: int  # until the oldest entry leaves the window (0: window empty)


@dataclass(frozen=True, slots=True)
class Verdict:
    admitted: bool
    states: tuple[ScopeState, ...]
    reason: Reason | None = None
    scope_index: int = -1  # which scope refused first
    retry_after_ms: int = 0  # when every refusing scope would admit it (0: never/unknown)


class LimiterBackend(Protocol):
    """Where the windows and leases live: Redis (shared by all replicas) or this process."""

    name: str

    async def admit(self, ask: Ask, now_ms: int) -> Verdict: ...

    async def settle(self, ask: Ask, used_tokens: int, now_ms: int) -> None: ...

    async def renew(self, asks: Sequence[Ask], now_ms: int) -> None: ...


def limit_args(limits: Limits) -> tuple[int, int, int]:
    """(rpm, tpm, max_streams) with 0 for unlimited, as both backends take them."""
    return (limits.rpm or 0, limits.tpm or 0, limits.max_streams or 0)
