"""Key verification against a real Redis: cache, negative cache, invalidation over pub/sub,
expiry, disabled tenants, shared lookups, and serving stale entries while Redis is down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from services.common.clock import ManualClock
from services.common.errors import AuthenticationFailed, PermissionDenied, Unavailable
from services.edge.breaker import Breaker
from services.edge.counters import EdgeCounters
from services.edge.httperrors import KeyRevoked, TenantDisabled
from services.edge.tenancy.apikeys import KeyHasher, new_raw_key
from services.edge.tenancy.auth import AuthConfig, Authenticator
from services.edge.tenancy.directory import EVENTS_CHANNEL, Directory
from services.edge.tenancy.tenants import Tenant, TenantPatch
from tests.support.redis_proc import RedisProcess
from tests.support.wait import eventually

HASHER = KeyHasher(b"auth-test-pepper-0123")


@dataclass
class Env:
    auth: Authenticator
    directory: Directory
    client: aioredis.Redis
    clock: ManualClock
    counters: EdgeCounters


async def make_env(url: str) -> Env:
    client = aioredis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    clock, counters = ManualClock(), EdgeCounters()
    directory = Directory(redis=client, hasher=HASHER, clock=clock)
    auth = Authenticator(
        directory=directory,
        hasher=HASHER,
        clock=clock,
        breaker=Breaker(clock=clock, counters=counters, open_for_s=1.0),
        counters=counters,
        config=AuthConfig(cache_ttl_s=2.0, stale_ttl_s=60.0, negative_ttl_s=1.0),
    )
    await directory.ensure_tenant(Tenant(tenant_id="acme"))
    return Env(auth, directory, client, clock, counters)


@pytest.fixture
async def env(redis_url: str) -> AsyncIterator[Env]:
    e = await make_env(redis_url)
    yield e
    await e.client.aclose()


async def test_a_verified_key_is_served_from_the_cache(env: Env) -> None:
    raw, record = await env.directory.create_key("acme")
    principal = await env.auth.verify(raw)
    assert principal.key == record
    assert principal.tenant.tenant_id == "acme"
    await env.auth.verify(raw)
    assert (env.counters.auth_lookups, env.counters.auth_cache_hits) == (1, 1)
    env.clock.advance(2.0)
    await env.auth.verify(raw)
    assert env.counters.auth_lookups == 2


async def test_a_key_in_the_wrong_format_is_refused_without_a_lookup(env: Env) -> None:
    with pytest.raises(AuthenticationFailed, match="format"):
        await env.auth.verify("sk-proj-abc")
    assert (env.counters.auth_malformed, env.counters.auth_lookups) == (1, 0)


async def test_unknown_keys_are_refused_and_remembered_briefly(env: Env) -> None:
    raw = new_raw_key()
    for _ in range(3):
        with pytest.raises(AuthenticationFailed):
            await env.auth.verify(raw)
    assert env.counters.auth_lookups == 1
    assert env.counters.auth_invalid == 3
    env.clock.advance(1.0)
    with pytest.raises(AuthenticationFailed):
        await env.auth.verify(raw)
    assert env.counters.auth_lookups == 2


async def test_concurrent_misses_share_one_lookup(env: Env) -> None:
    raw, _ = await env.directory.create_key("acme")
    results = await asyncio.gather(*(env.auth.verify(raw) for _ in range(20)))
    assert len({r.key.key_id for r in results}) == 1
    assert env.counters.auth_lookups == 1


async def test_a_revocation_reaches_the_cache_over_pub_sub(env: Env) -> None:
    raw, record = await env.directory.create_key("acme")
    stop = asyncio.Event()
    listener = asyncio.create_task(env.auth.listen(env.client, stop))
    await env.auth.verify(raw)
    await _until_subscribed(env.client)
    await env.directory.revoke_key(record.key_id)
    await eventually(lambda: env.counters.auth_invalidations >= 1, timeout_s=3.0)
    with pytest.raises(AuthenticationFailed):
        await env.auth.verify(raw)  # no clock advance: the event, not the TTL, did it
    stop.set()
    await listener


async def _until_subscribed(client: aioredis.Redis) -> None:
    for _ in range(500):
        if (await client.pubsub_numsub(EVENTS_CHANNEL))[0][1]:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("the edge never subscribed")


async def test_without_events_a_revocation_is_seen_within_the_cache_ttl(env: Env) -> None:
    raw, record = await env.directory.create_key("acme")
    await env.auth.verify(raw)
    await env.directory.revoke_key(record.key_id)
    await env.auth.verify(raw)  # still cached
    env.clock.advance(2.0)
    with pytest.raises(AuthenticationFailed):
        await env.auth.verify(raw)


async def test_an_expiring_key_stops_at_its_expiry_even_when_cached(env: Env) -> None:
    expires = int(env.clock.time() * 1000) + 500
    raw, _ = await env.directory.create_key("acme", expires_ms=expires)
    await env.auth.verify(raw)
    env.clock.advance(0.5)
    with pytest.raises(AuthenticationFailed):
        await env.auth.verify(raw)


async def test_keys_of_a_disabled_tenant_are_forbidden(env: Env) -> None:
    raw, _ = await env.directory.create_key("acme")
    await env.directory.update_tenant("acme", TenantPatch(disabled=True))
    with pytest.raises(PermissionDenied) as err:
        await env.auth.verify(raw)
    assert err.value.http_status == 403
    assert env.counters.auth_disabled_tenant == 1


async def test_a_tenant_event_makes_its_keys_re_verify(env: Env) -> None:
    raw, _ = await env.directory.create_key("acme")
    await env.auth.verify(raw)
    await env.directory.update_tenant("acme", TenantPatch(disabled=True))
    env.auth.invalidate("tenant:acme")
    with pytest.raises(PermissionDenied):
        await env.auth.verify(raw)


async def test_while_redis_is_down_recent_keys_work_and_others_get_503(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path / "redis")
    server.start()
    env = await make_env(server.url)
    try:
        raw, _ = await env.directory.create_key("acme")
        other, _ = await env.directory.create_key("acme")
        await env.auth.verify(raw)
        await env.client.save()  # so the restarted server comes back with its data
        server.stop()
        env.clock.advance(2.0)  # past the cache TTL: it would look the key up
        assert (await env.auth.verify(raw)).tenant.tenant_id == "acme"
        assert env.counters.auth_stale_served == 1
        with pytest.raises(Unavailable) as err:
            await env.auth.verify(other)
        assert err.value.http_status == 503
        env.clock.advance(60.0)  # past the stale TTL as well
        with pytest.raises(Unavailable):
            await env.auth.verify(raw)
        server.start()  # back on the same port
        env.clock.advance(1.0)  # the breaker lets a call through again
        assert (await env.auth.verify(other)).tenant.tenant_id == "acme"
    finally:
        await env.client.aclose()
        server.stop()


def test_bad_auth_config_is_refused() -> None:
    with pytest.raises(ValueError, match="cache_ttl_s <= stale_ttl_s"):
        AuthConfig(cache_ttl_s=10, stale_ttl_s=5)
    with pytest.raises(ValueError, match="negative_ttl_s"):
        AuthConfig(negative_ttl_s=5, cache_ttl_s=2)


async def test_an_edge_that_fails_closed_serves_nothing_stale(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path / "redis")
    server.start()
    env = await make_env(server.url)
    closed = Authenticator(
        directory=env.directory,
        hasher=HASHER,
        clock=env.clock,
        breaker=Breaker(clock=env.clock, counters=env.counters),
        counters=env.counters,
        serve_stale=False,
    )
    try:
        raw, _ = await env.directory.create_key("acme")
        await closed.verify(raw)
        server.stop()
        await closed.verify(raw)  # still fresh: no Redis needed
        env.clock.advance(2.0)
        with pytest.raises(Unavailable):
            await closed.verify(raw)
    finally:
        await env.client.aclose()
        server.stop()


async def test_a_recheck_says_what_ends_a_running_request(env: Env) -> None:
    """What services/edge/tenancy/revocation.py cuts a request in flight with: nothing for a
    usable key (a rotated one within its grace too), the 401 for a revoked or deleted one,
    the 403 for a disabled tenant — each read from Redis, not the cache."""
    kept, kept_record = await env.directory.create_key("acme")
    revoked, revoked_record = await env.directory.create_key("acme")
    principal = await env.auth.verify(kept)
    assert principal.digest == HASHER.digest(kept)
    assert await env.auth.recheck(HASHER.digest(kept)) is None
    await env.directory.rotate_key(kept_record.key_id, grace_s=60.0)
    assert await env.auth.recheck(HASHER.digest(kept)) is None

    await env.auth.verify(revoked)  # cached: the recheck must not trust that
    await env.directory.revoke_key(revoked_record.key_id)
    env.auth.invalidate(f"key:{HASHER.digest(revoked)}")
    why = await env.auth.recheck(HASHER.digest(revoked))
    assert isinstance(why, KeyRevoked)
    assert (why.http_status, why.code) == (401, "invalid_api_key")
    assert isinstance(await env.auth.recheck(HASHER.digest(new_raw_key())), KeyRevoked)

    await env.directory.update_tenant("acme", TenantPatch(disabled=True))
    env.auth.invalidate("tenant:acme")
    why = await env.auth.recheck(HASHER.digest(kept))
    assert isinstance(why, TenantDisabled)
    assert (why.http_status, why.code) == (403, "tenant_disabled")


async def test_a_recheck_after_a_rotation_grace_ran_out_says_the_key_expired(env: Env) -> None:
    """The check the expiry timer makes (no event: the key is still cached) tells the client
    its key expired, not that somebody revoked it; the cache learns the new expiry first."""
    raw, record = await env.directory.create_key("acme")
    digest = HASHER.digest(raw)
    await env.auth.verify(raw)
    assert env.auth.expires_ms(digest) is None
    await env.directory.rotate_key(record.key_id, grace_s=30.0)
    assert await env.auth.recheck(digest) is None
    ends = env.auth.expires_ms(digest)
    assert ends == int(env.clock.time() * 1000) + 30_000
    env.clock.advance(30.0)
    why = await env.auth.recheck(digest)
    assert isinstance(why, KeyRevoked)
    assert (why.http_status, why.code) == (401, "invalid_api_key")
    assert "expired" in why.message
    assert env.auth.expires_ms(digest) is None  # no longer cached


async def test_a_recheck_while_redis_is_down_ends_nothing(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path / "redis")
    server.start()
    env = await make_env(server.url)
    try:
        raw, record = await env.directory.create_key("acme")
        await env.directory.revoke_key(record.key_id)
        server.stop()
        assert await env.auth.recheck(HASHER.digest(raw)) is None
    finally:
        await env.client.aclose()
        server.stop()


async def test_every_invalidation_is_passed_on_after_it_is_applied(env: Env) -> None:
    seen: list[tuple[str, str]] = []
    env.auth.on_change = lambda kind, value: seen.append((kind, value))
    env.auth.invalidate("key:abc")
    env.auth.invalidate("tenant:acme")
    env.auth.invalidate("something-new")
    env.auth.expire_all()
    assert seen == [("key", "abc"), ("tenant", "acme"), ("all", ""), ("all", "")]
