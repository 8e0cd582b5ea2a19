"""Tenants and API keys in Redis: create, read, list, update, rotate, revoke.

Used by the admin API, the local stack's bootstrap and the tests; the request path only reads
(see :mod:`services.edge.tenancy.auth`). Every change that could make a cached verdict wrong is
published on :data:`EVENTS_CHANNEL`, so every edge replica drops it at once (their short cache
TTL is the backstop if a message is lost).

Redis layout (``meridian:`` prefix; ``{t:ID}`` is a Redis Cluster hash tag, so a tenant and
its key list live on one shard)::

    tenants                  set     tenant ids
    tenant:{t:ID}            string  the tenant, JSON (services.edge.tenancy.tenants.Tenant)
    tenant:{t:ID}:keys       set     key ids of the tenant
    apikey:DIGEST            hash    key_id, tenant, name, created_ms, [expires_ms],
                                     [revoked_ms], [limits]   (digest = HMAC-SHA256, hex)
    keyid:KEY_ID             string  the digest (admin lookups by key id)

Works the same on one server, Sentinel and Cluster: no transaction spans two hash slots (the
only MULTI is a WATCHed update of one tenant), and no multi-key command spans two either;
where a change touches several keys they are written in an order that is safe to stop half
way, and the event is published after the change is stored.

The raw key exists only in the caller's hands: ``create_key``/``rotate_key`` return it once.
"""

from __future__ import annotations

import redis.exceptions
from redis.typing import EncodableT, FieldT

from services.common.clock import Clock
from services.common.errors import InvalidRequest, NotFound
from services.edge.httperrors import Conflict
from services.edge.redisconn import RedisClient
from services.edge.tenancy.apikeys import KEY_ID_CHARS, KeyHasher, KeyRecord, new_raw_key
from services.edge.tenancy.tenants import Limits, Tenant, TenantPatch, valid_tenant_id

NS = "meridian:"
EVENTS_CHANNEL = f"{NS}auth:events"
MAX_GRACE_S = 30 * 24 * 3600


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _tenant_key(tenant_id: str) -> str:
    return f"{NS}tenant:{{t:{tenant_id}}}"


def _tenant_keys(tenant_id: str) -> str:
    return f"{NS}tenant:{{t:{tenant_id}}}:keys"


def _apikey(digest: str) -> str:
    return f"{NS}apikey:{digest}"


def key_event(digest: str) -> str:
    return f"key:{digest}"


def tenant_event(tenant_id: str) -> str:
    return f"tenant:{tenant_id}"


class Directory:
    def __init__(self, *, redis: RedisClient, hasher: KeyHasher, clock: Clock) -> None:
        self._redis = redis
        self._hasher = hasher
        self._clock = clock

    def _now_ms(self) -> int:
        return int(self._clock.time() * 1000)

    async def _publish(self, message: str) -> None:
        """Tell every replica, *after* the change is stored (a replica that re-reads on the
        event must see it)."""
        await self._redis.publish(EVENTS_CHANNEL, message)

    # Tenants ---------------------------------------------------------------------------------

    async def create_tenant(self, tenant: Tenant) -> Tenant:
        stored = tenant.model_copy(update={"created_ms": self._now_ms()})
        created = await self._redis.set(
            _tenant_key(tenant.tenant_id), stored.model_dump_json(), nx=True
        )
        if not created:
            raise Conflict(f"tenant {tenant.tenant_id!r} already exists", param="tenant_id")
        await self._redis.sadd(f"{NS}tenants", tenant.tenant_id)
        return stored

    async def ensure_tenant(self, tenant: Tenant) -> Tenant:
        """The tenant as stored, creating it as given if it does not exist yet."""
        existing = await self.get_tenant(tenant.tenant_id)
        if existing is not None:
            return existing
        try:
            return await self.create_tenant(tenant)
        except Conflict:
            return await self.require_tenant(tenant.tenant_id)

    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        if not valid_tenant_id(tenant_id):
            return None
        raw = await self._redis.get(_tenant_key(tenant_id))
        return Tenant.model_validate_json(raw) if raw is not None else None

    async def require_tenant(self, tenant_id: str) -> Tenant:
        tenant = await self.get_tenant(tenant_id)
        if tenant is None:
            raise NotFound(f"no tenant {tenant_id!r}", code="tenant_not_found")
        return tenant

    async def list_tenants(self) -> list[Tenant]:
        ids = sorted(_text(m) for m in await self._redis.smembers(f"{NS}tenants"))
        if not ids:
            return []
        # One GET each in one pipeline, not MGET: on a Redis Cluster the tenants live on
        # different shards, and the cluster client splits a pipeline per shard.
        async with self._redis.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.get(_tenant_key(i))
            raws = await pipe.execute()
        return [Tenant.model_validate_json(r) for r in raws if r is not None]

    async def update_tenant(self, tenant_id: str, patch: TenantPatch) -> Tenant:
        key = _tenant_key(tenant_id)
        while True:
            async with self._redis.pipeline(transaction=True) as pipe:
                await pipe.watch(key)  # a concurrent update makes us retry, not overwrite
                raw = await pipe.get(key)
                if raw is None:
                    raise NotFound(f"no tenant {tenant_id!r}", code="tenant_not_found")
                updated = patch.apply(Tenant.model_validate_json(raw))
                pipe.multi()  # type: ignore[no-untyped-call]  # untyped in redis-py
                pipe.set(key, updated.model_dump_json())
                try:
                    await pipe.execute()
                except redis.exceptions.WatchError:
                    continue
            await self._publish(tenant_event(tenant_id))
            return updated

    async def delete_tenant(self, tenant_id: str) -> None:
        """Revoke every key of the tenant, then forget the tenant."""
        await self.require_tenant(tenant_id)
        for record in await self.list_keys(tenant_id):
            if record.revoked_ms is None:
                await self.revoke_key(record.key_id)
        await self._redis.delete(_tenant_key(tenant_id))
        await self._redis.srem(f"{NS}tenants", tenant_id)
        await self._publish(tenant_event(tenant_id))

    # Keys ------------------------------------------------------------------------------------

    async def create_key(
        self,
        tenant_id: str,
        *,
        name: str = "",
        limits: Limits | None = None,
        expires_ms: int | None = None,
    ) -> tuple[str, KeyRecord]:
        """A new key for an existing tenant. The raw key is returned once and never stored."""
        await self.require_tenant(tenant_id)
        if len(name) > 256:
            raise InvalidRequest("name must be at most 256 characters", param="name")
        while True:
            raw = new_raw_key()
            digest = self._hasher.digest(raw)
            record = KeyRecord(
                key_id=digest[:KEY_ID_CHARS],
                tenant=tenant_id,
                name=name,
                created_ms=self._now_ms(),
                expires_ms=expires_ms,
                limits=limits,
            )
            # A 48-bit key-id collision is astronomically unlikely; never overwrite one.
            if await self._redis.set(f"{NS}keyid:{record.key_id}", digest, nx=True):
                break
        # Listed first, then usable: a key whose record exists is always in its tenant's
        # list (a listed id without a record is skipped by list_keys).
        await self._redis.sadd(_tenant_keys(tenant_id), record.key_id)
        fields: dict[FieldT, EncodableT] = {k: v for k, v in record.to_fields().items()}
        await self._redis.hset(_apikey(digest), mapping=fields)
        return raw, record

    async def load_key(self, digest: str) -> KeyRecord | None:
        fields = await self._redis.hgetall(_apikey(digest))
        return KeyRecord.from_fields(fields) if fields else None

    async def _digest_of(self, key_id: str) -> str:
        raw = await self._redis.get(f"{NS}keyid:{key_id}") if len(key_id) <= 64 else None
        if raw is None:
            raise NotFound(f"no key {key_id!r}", code="key_not_found")
        return _text(raw)

    async def get_key(self, key_id: str) -> KeyRecord:
        record = await self.load_key(await self._digest_of(key_id))
        if record is None:
            raise NotFound(f"no key {key_id!r}", code="key_not_found")
        return record

    async def list_keys(self, tenant_id: str) -> list[KeyRecord]:
        await self.require_tenant(tenant_id)
        members = await self._redis.smembers(_tenant_keys(tenant_id))
        ids = sorted(_text(m) for m in members)
        records = []
        for key_id in ids:
            try:
                records.append(await self.get_key(key_id))
            except NotFound:
                continue
        return records

    async def revoke_key(self, key_id: str) -> KeyRecord:
        """Revoke now; every edge drops the key from its cache (pub/sub), within its TTL."""
        return await self._end_key(key_id, revoke=True, at_ms=self._now_ms())

    async def _end_key(self, key_id: str, *, revoke: bool, at_ms: int) -> KeyRecord:
        digest = await self._digest_of(key_id)
        field = "revoked_ms" if revoke else "expires_ms"
        await self._redis.hset(_apikey(digest), field, str(at_ms))
        await self._publish(key_event(digest))
        return await self.get_key(key_id)

    async def rotate_key(self, key_id: str, *, grace_s: float = 0.0) -> tuple[str, KeyRecord]:
        """A new key with the old one's tenant, name, limits and expiry; the old one stops
        working after ``grace_s`` (0: at once) or at its own expiry, whichever is first, so
        clients can switch without an outage — and rotation never lengthens a key's life.

        A key rotates once: a second rotation (during the grace period, or racing the first)
        is a 409 naming its successor, not one more live key and a later end each time."""
        if not 0 <= grace_s <= MAX_GRACE_S:
            raise InvalidRequest(f"grace_s must be 0..{MAX_GRACE_S}", param="grace_s")
        old = await self.get_key(key_id)
        if not old.usable(self._now_ms()):
            raise InvalidRequest(f"key {key_id!r} is already revoked or expired", param="key_id")
        digest = await self._digest_of(key_id)
        claimed = await self._redis.hsetnx(_apikey(digest), "rotated_to", "pending")
        if not claimed or old.rotated_to:
            current = await self.get_key(key_id)
            raise Conflict(
                f"key {key_id!r} was already rotated (to {current.rotated_to!r})",
                param="key_id",
            )
        raw, new = await self.create_key(
            old.tenant, name=old.name, limits=old.limits, expires_ms=old.expires_ms
        )
        await self._redis.hset(_apikey(digest), "rotated_to", new.key_id)
        if grace_s == 0:
            await self.revoke_key(key_id)
        else:
            ends = self._now_ms() + int(grace_s * 1000)
            if old.expires_ms is not None:
                ends = min(ends, old.expires_ms)
            await self._end_key(key_id, revoke=False, at_ms=ends)
        return raw, new
