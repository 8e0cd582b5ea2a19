"""What the Lua limiter leaves in Redis: keys under the tenant's hash tag, each expiring."""

from __future__ import annotations

import redis.asyncio as aioredis

from services.edge.ratelimit.redis_backend import RedisBackend, scope_keys
from services.edge.ratelimit.types import Ask, Scope
from services.edge.tenancy.tenants import Limits


def text(name: bytes | str) -> str:
    """A key name as text (the client has no ``decode_responses``, so Redis answers bytes)."""
    assert isinstance(name, bytes), name
    return name.decode()


async def test_state_lives_under_the_tenant_hash_tag_and_expires(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    backend = RedisBackend(redis=client, window_ms=60_000, lease_ms=30_000)
    key = Scope("key", "k1", "{acme}:k:k1", Limits(rpm=5, tpm=100, max_streams=2))
    tenant = Scope("tenant", "acme", "{acme}:t", Limits(rpm=50))
    verdict = await backend.admit(Ask("r1", 10, (key, tenant)), 1_000_000)
    assert verdict.admitted
    names = sorted(text(k) for k in await client.keys("*"))
    assert names == sorted(
        [*scope_keys(key), *(k for k in scope_keys(tenant) if not k.endswith(":c"))]
    )
    assert all("{acme}" in n for n in names)
    for name in names:
        ttl = await client.pttl(name)
        assert 0 < ttl <= 90_000
    await client.aclose()


async def test_renewal_refreshes_only_live_leases(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    backend = RedisBackend(redis=client, window_ms=60_000, lease_ms=30_000)
    scope = Scope("key", "k1", "{acme}:k:k1", Limits(max_streams=2))
    live, done = Ask("live", 1, (scope,)), Ask("done", 1, (scope,))
    await backend.admit(live, 1_000)
    await backend.admit(done, 1_000)
    await backend.settle(done, 1, 2_000)
    await backend.renew([live, done], 10_000)
    leases = await client.zrange(scope_keys(scope)[2], 0, -1, withscores=True)
    assert leases == [(b"live", 40_000.0)]  # "done" was not resurrected by the renewal
    await client.aclose()
