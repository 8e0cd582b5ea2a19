"""API keys, stored only as hashes in Redis.

A key looks like ``mk-`` + 43 URL-safe characters (256 random bits). Only its SHA-256 is ever
stored or logged (as ``key_id``, the first 12 hex characters of the hash); because keys are
high-entropy random strings, a fast hash is the right tool (there is nothing to brute-force).
Lookup is by hash, so the raw key is never compared character by character anywhere.

Redis layout (``meridian:`` prefix):

    apikey:{sha256}   hash   tenant, key_id, created_ms, [revoked_ms], [name]
    tenant:{id}:keys  set    sha256 of each key of the tenant

Verified keys are cached at the edge for ``cache_ttl_s`` so the hot path rarely touches Redis;
a revoked key stops working within that TTL on every edge replica.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from services.common.clock import Clock

KEY_PREFIX = "mk-"
_KEY_RE = re.compile(r"^mk-[A-Za-z0-9_-]{43}$")
NS = "meridian:"


def new_raw_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def looks_like_key(raw: str) -> bool:
    return bool(_KEY_RE.match(raw))


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True, slots=True)
class KeyRecord:
    key_id: str
    tenant: str
    name: str = ""


class ApiKeyStore:
    def __init__(self, *, redis: aioredis.Redis, clock: Clock, cache_ttl_s: float = 2.0) -> None:
        self._redis = redis
        self._clock = clock
        self._cache_ttl_s = cache_ttl_s
        self._cache: dict[str, tuple[float, KeyRecord | None]] = {}

    async def create(self, tenant: str, name: str = "") -> tuple[str, KeyRecord]:
        """Make a new key for ``tenant``. The raw key is returned once and never stored."""
        raw = new_raw_key()
        digest = key_hash(raw)
        record = KeyRecord(key_id=digest[:12], tenant=tenant, name=name)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                f"{NS}apikey:{digest}",
                mapping={
                    "tenant": tenant,
                    "key_id": record.key_id,
                    "name": name,
                    "created_ms": int(time.time() * 1000),
                },
            )
            pipe.sadd(f"{NS}tenant:{tenant}:keys", digest)
            await pipe.execute()
        return raw, record

    async def verify(self, raw: str) -> KeyRecord | None:
        """The key's record if it exists and is not revoked; cached briefly (also misses)."""
        digest = key_hash(raw)
        now = self._clock.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            return hit[1]
        fields = await self._redis.hgetall(f"{NS}apikey:{digest}")
        record: KeyRecord | None = None
        if fields and b"revoked_ms" not in fields:
            record = KeyRecord(
                key_id=_text(fields.get(b"key_id")),
                tenant=_text(fields.get(b"tenant")),
                name=_text(fields.get(b"name")),
            )
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[digest] = (now + self._cache_ttl_s, record)
        return record
