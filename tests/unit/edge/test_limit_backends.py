"""One table of behaviours, run on both limit backends: the in-process window (the fallback
and the specification) and the Lua script in a real Redis. If they ever disagree, one is wrong.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from services.edge.ratelimit.redis_backend import RedisBackend
from services.edge.ratelimit.types import Ask, LimiterBackend, Reason, Scope, ScopeState
from services.edge.ratelimit.window import LocalBackend
from services.edge.tenancy.tenants import Limits

WINDOW = 60_000
LEASE = 30_000
T0 = 1_700_000_000_000


@pytest.fixture(params=["local", "redis"])
async def backend(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[LimiterBackend]:
    if request.param == "local":
        yield LocalBackend(window_ms=WINDOW, lease_ms=LEASE)
        return
    client = aioredis.Redis.from_url(redis_url)
    yield RedisBackend(redis=client, window_ms=WINDOW, lease_ms=LEASE)
    await client.aclose()


def key_scope(**limits: int) -> Scope:
    return Scope("key", "k1", "{t1}:k:k1", Limits(**limits))


def tenant_scope(**limits: int) -> Scope:
    return Scope("tenant", "t1", "{t1}:t", Limits(**limits))


_n = 0


def ask(tokens: int, *scopes: Scope) -> Ask:
    global _n
    _n += 1
    return Ask(f"r{_n}", tokens, scopes or (key_scope(rpm=1000),))


async def test_requests_per_minute_are_exact(backend: LimiterBackend) -> None:
    s = key_scope(rpm=3)
    for i in range(3):
        assert (await backend.admit(ask(1, s), T0 + i)).admitted
    refused = await backend.admit(ask(1, s), T0 + 10)
    assert not refused.admitted
    assert refused.reason is Reason.REQUESTS
    assert refused.retry_after_ms == WINDOW - 10  # the oldest leaves the window then
    assert not (await backend.admit(ask(1, s), T0 + WINDOW - 1)).admitted
    assert (await backend.admit(ask(1, s), T0 + WINDOW)).admitted


async def test_admitting_the_same_request_again_admits_it_without_charging_it_twice(
    backend: LimiterBackend,
) -> None:
    """A retry whose first answer was lost (a timeout, a dropped connection after the script
    ran) must not take a second request slot, reservation or stream slot."""
    s = key_scope(rpm=2, tpm=100, max_streams=1)
    first = ask(40, s)
    assert (await backend.admit(first, T0)).admitted
    again = await backend.admit(first, T0 + 5)
    assert again.admitted
    assert again.states == (ScopeState(1, 40, 1, WINDOW - 5),)
    refused = await backend.admit(ask(40, s), T0 + 6)
    assert refused.reason is Reason.STREAMS  # one stream slot, held once
    await backend.settle(first, 40, T0 + 7)
    assert (await backend.admit(ask(40, s), T0 + 8)).states[0] == ScopeState(2, 80, 1, WINDOW - 8)


async def test_reservations_bound_concurrent_requests_before_any_usage_is_known(
    backend: LimiterBackend,
) -> None:
    s = key_scope(tpm=100)
    verdicts = [await backend.admit(ask(40, s), T0) for _ in range(3)]
    assert [v.admitted for v in verdicts] == [True, True, False]
    assert verdicts[2].reason is Reason.TOKENS
    assert verdicts[1].states[0].tokens == 80


async def test_settling_replaces_the_reservation_with_real_usage(backend: LimiterBackend) -> None:
    s = key_scope(tpm=100)
    first = ask(60, s)
    assert (await backend.admit(first, T0)).admitted
    assert not (await backend.admit(ask(80, s), T0 + 1)).admitted
    await backend.settle(first, 10, T0 + 2)
    assert (await backend.admit(ask(80, s), T0 + 3)).admitted


async def test_usage_over_the_reservation_is_charged_in_full(backend: LimiterBackend) -> None:
    s = key_scope(tpm=100)
    first = ask(50, s)
    assert (await backend.admit(first, T0)).admitted
    await backend.settle(first, 90, T0 + 1)
    refused = await backend.admit(ask(20, s), T0 + 2)
    assert not refused.admitted
    assert refused.states[0].tokens == 90


async def test_token_retry_is_when_enough_old_reservations_leave(backend: LimiterBackend) -> None:
    s = key_scope(tpm=100)
    for i in range(3):
        assert (await backend.admit(ask(30, s), T0 + i * 10_000)).admitted
    refused = await backend.admit(ask(40, s), T0 + 30_000)
    assert refused.reason is Reason.TOKENS
    # 90 + 40 - 100 = 30 must leave: the first reservation does, at T0 + WINDOW.
    assert refused.retry_after_ms == WINDOW - 30_000


async def test_concurrent_streams_are_capped_and_freed_when_settled(
    backend: LimiterBackend,
) -> None:
    s = key_scope(max_streams=2)
    a, b = ask(1, s), ask(1, s)
    assert (await backend.admit(a, T0)).admitted
    assert (await backend.admit(b, T0)).admitted
    refused = await backend.admit(ask(1, s), T0 + 1)
    assert refused.reason is Reason.STREAMS
    assert refused.retry_after_ms == 1000
    await backend.settle(a, 1, T0 + 2)
    assert (await backend.admit(ask(1, s), T0 + 3)).admitted


async def test_stream_leases_expire_unless_renewed(backend: LimiterBackend) -> None:
    s = key_scope(max_streams=1)
    held = ask(1, s)
    assert (await backend.admit(held, T0)).admitted
    await backend.renew([held], T0 + 20_000)  # still held at T0 + LEASE ...
    assert not (await backend.admit(ask(1, s), T0 + LEASE)).admitted
    # ... and released once the renewed lease runs out (an edge that crashed).
    assert (await backend.admit(ask(1, s), T0 + 20_000 + LEASE)).admitted


async def test_a_reservation_over_the_whole_tpm_is_too_large(backend: LimiterBackend) -> None:
    refused = await backend.admit(ask(101, key_scope(tpm=100)), T0)
    assert refused.reason is Reason.TOO_LARGE
    assert refused.retry_after_ms == 0


async def test_every_scope_must_admit_and_a_refusal_records_nothing(
    backend: LimiterBackend,
) -> None:
    k, t = key_scope(rpm=10, tpm=1000), tenant_scope(rpm=1)
    assert (await backend.admit(ask(5, k, t), T0)).admitted
    refused = await backend.admit(ask(5, k, t), T0 + 1)
    assert refused.reason is Reason.REQUESTS
    assert refused.scope_index == 1
    assert refused.states[0].requests == 1  # the key scope did not count the refused one
    assert refused.states[0].tokens == 5


async def test_states_report_usage_and_when_room_frees(backend: LimiterBackend) -> None:
    s = key_scope(rpm=10, tpm=1000, max_streams=5)
    await backend.admit(ask(100, s), T0)
    verdict = await backend.admit(ask(50, s), T0 + 5_000)
    state = verdict.states[0]
    assert (state.requests, state.tokens, state.streams) == (2, 150, 2)
    assert state.reset_ms == WINDOW - 5_000


async def test_unlimited_dimensions_are_not_tracked(backend: LimiterBackend) -> None:
    s = key_scope(max_streams=3)
    verdict = await backend.admit(ask(100, s), T0)
    assert (verdict.states[0].requests, verdict.states[0].tokens) == (0, 0)
    assert verdict.states[0].streams == 1


async def test_settling_an_unknown_request_changes_nothing(backend: LimiterBackend) -> None:
    s = key_scope(tpm=100, max_streams=1)
    assert (await backend.admit(ask(60, s), T0)).admitted
    await backend.settle(ask(60, s), 0, T0 + 1)
    refused = await backend.admit(ask(60, s), T0 + 2)
    assert refused.states[0].tokens == 60
    assert refused.states[0].streams == 1


async def test_long_windows_are_walked_and_purged_in_batches(backend: LimiterBackend) -> None:
    s = key_scope(tpm=10_000)
    for i in range(600):  # more than one 256-entry batch in the script
        assert (await backend.admit(ask(10, s), T0 + i)).admitted
    refused = await backend.admit(ask(5_000, s), T0 + 1_000)
    # 6000 + 5000 - 10000 = 1000 tokens must leave: the 100th entry (at T0 + 99) frees them.
    assert refused.retry_after_ms == 99 + WINDOW - 1_000
    verdict = await backend.admit(ask(10_000, s), T0 + WINDOW + 600)
    assert verdict.admitted
    assert verdict.states[0].requests == 1
