"""Tenants and keys in a real Redis: what is stored, what is published, what is refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from services.common.clock import ManualClock
from services.common.errors import InvalidRequest, NotFound
from services.edge.httperrors import Conflict
from services.edge.tenancy.apikeys import KeyHasher
from services.edge.tenancy.directory import EVENTS_CHANNEL, Directory
from services.edge.tenancy.tenants import Limits, Tenant, TenantPatch, Tier

HASHER = KeyHasher(b"directory-test-pepper")


def as_bytes(value: object) -> bytes:
    """A Redis reply as bytes: the client has no ``decode_responses``, so that is what Redis
    answers (the client's types also allow ``str``)."""
    assert isinstance(value, bytes), value
    return value


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def directory(client: aioredis.Redis, clock: ManualClock) -> Directory:
    return Directory(redis=client, hasher=HASHER, clock=clock)


async def test_tenants_are_created_once_listed_and_patched(directory: Directory) -> None:
    created = await directory.create_tenant(Tenant(tenant_id="acme", tier=Tier.HIGH))
    assert created.created_ms > 0
    with pytest.raises(Conflict):
        await directory.create_tenant(Tenant(tenant_id="acme"))
    await directory.create_tenant(Tenant(tenant_id="beta"))
    assert [t.tenant_id for t in await directory.list_tenants()] == ["acme", "beta"]
    patched = await directory.update_tenant("acme", TenantPatch(limits=Limits(rpm=9)))
    assert patched.tier is Tier.HIGH
    assert patched.limits.rpm == 9
    assert await directory.get_tenant("acme") == patched
    assert await directory.ensure_tenant(Tenant(tenant_id="acme")) == patched
    with pytest.raises(NotFound):
        await directory.update_tenant("ghost", TenantPatch(disabled=True))


async def test_keys_are_stored_by_keyed_hash_only(
    directory: Directory, client: aioredis.Redis
) -> None:
    await directory.create_tenant(Tenant(tenant_id="acme"))
    raw, record = await directory.create_key("acme", name="ci", limits=Limits(rpm=5))
    assert record.key_id == HASHER.digest(raw)[:12]
    assert await directory.load_key(HASHER.digest(raw)) == record
    assert await directory.get_key(record.key_id) == record
    assert [k.key_id for k in await directory.list_keys("acme")] == [record.key_id]
    for name in map(as_bytes, await client.keys("*")):
        assert raw.encode() not in name
        kind = await client.type(name)
        if kind == b"hash":
            assert raw.encode() not in b"".join(
                as_bytes(k) + as_bytes(v) for k, v in (await client.hgetall(name)).items()
            )
        elif kind == b"string":
            assert raw.encode() not in as_bytes(await client.get(name))


async def test_keys_need_an_existing_tenant(directory: Directory) -> None:
    with pytest.raises(NotFound) as err:
        await directory.create_key("ghost")
    assert err.value.code == "tenant_not_found"


async def test_changes_are_published_for_every_edge(
    directory: Directory, client: aioredis.Redis
) -> None:
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(EVENTS_CHANNEL)
    await directory.create_tenant(Tenant(tenant_id="acme"))
    raw, record = await directory.create_key("acme")
    await directory.revoke_key(record.key_id)
    await directory.update_tenant("acme", TenantPatch(disabled=True))
    seen: list[str] = []
    while len(seen) < 2:
        msg = await pubsub.get_message(timeout=1.0)
        if msg is not None:
            seen.append(as_bytes(msg["data"]).decode())
    assert seen == [f"key:{HASHER.digest(raw)}", "tenant:acme"]
    await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py: PubSub.aclose unannotated


async def test_rotation_makes_a_twin_key_and_ends_the_old_one(
    directory: Directory, clock: ManualClock
) -> None:
    await directory.create_tenant(Tenant(tenant_id="acme"))
    _, old = await directory.create_key("acme", name="prod", limits=Limits(tpm=10))
    _raw_new, new = await directory.rotate_key(old.key_id, grace_s=60)
    assert (new.tenant, new.name, new.limits) == ("acme", "prod", Limits(tpm=10))
    ended = await directory.get_key(old.key_id)
    now_ms = int(clock.time() * 1000)
    assert ended.expires_ms == now_ms + 60_000
    assert ended.usable(now_ms)
    assert not ended.usable(now_ms + 60_000)
    _, newest = await directory.rotate_key(new.key_id)
    assert (await directory.get_key(new.key_id)).revoked_ms is not None
    with pytest.raises(InvalidRequest):
        await directory.rotate_key(new.key_id)
    with pytest.raises(InvalidRequest):
        await directory.rotate_key(newest.key_id, grace_s=-1)


async def test_rotation_never_lengthens_a_key_s_life_and_happens_once(
    directory: Directory, clock: ManualClock
) -> None:
    """The successor keeps the key's expiry (it was made without one: never expiring); the old
    key ends at the earlier of its expiry and the grace; a second rotation during the grace
    is a 409 (each one made another live key and pushed the old one's end further out)."""
    await directory.create_tenant(Tenant(tenant_id="acme"))
    now_ms = int(clock.time() * 1000)
    _, old = await directory.create_key("acme", expires_ms=now_ms + 3_000)
    _, new = await directory.rotate_key(old.key_id, grace_s=3600)
    assert new.expires_ms == now_ms + 3_000
    ended = await directory.get_key(old.key_id)
    assert ended.expires_ms == now_ms + 3_000  # not now + 3600 s
    assert ended.rotated_to == new.key_id
    assert ended.public()["rotated_to"] == new.key_id
    with pytest.raises(Conflict, match=new.key_id):
        await directory.rotate_key(old.key_id, grace_s=3600)
    assert (await directory.get_key(old.key_id)).expires_ms == now_ms + 3_000
    assert len(await directory.list_keys("acme")) == 2  # no third key


async def test_deleting_a_tenant_revokes_its_keys(directory: Directory) -> None:
    await directory.create_tenant(Tenant(tenant_id="acme"))
    _, record = await directory.create_key("acme")
    await directory.delete_tenant("acme")
    assert await directory.get_tenant("acme") is None
    assert (await directory.get_key(record.key_id)).revoked_ms is not None
    with pytest.raises(NotFound):
        await directory.get_key("nope")


async def test_concurrent_patches_are_not_lost(directory: Directory) -> None:
    await directory.create_tenant(Tenant(tenant_id="acme"))
    await asyncio.gather(
        directory.update_tenant("acme", TenantPatch(tier=Tier.HIGH)),
        directory.update_tenant("acme", TenantPatch(allowed_regions=("kr",))),
    )
    tenant = await directory.require_tenant("acme")
    assert (tenant.tier, tenant.allowed_regions) == (Tier.HIGH, ("kr",))
