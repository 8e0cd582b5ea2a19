"""Who is calling: ``Authorization: Bearer mk-…`` → a :class:`Principal` (key + tenant).

The hot path rarely touches Redis. A verified key is cached for ``cache_ttl_s`` (seconds, so
a revoked key stops working on every replica within that time even if an invalidation
message is lost); revocations and tenant changes are also pushed over Redis pub/sub and drop
the entry at once. Unknown keys are cached briefly too (``negative_ttl_s``) in a separate,
smaller map, so a client spraying random keys costs Redis little and cannot evict good
entries. Concurrent misses for one key share a single Redis lookup.

Degraded mode: if Redis cannot be reached (or the shared breaker is open), a key verified
within ``stale_ttl_s`` keeps working from the cache (counted as ``auth_stale_served``) when
the edge fails open (``serve_stale``); any other key gets 503, since it cannot be checked.
An edge that fails closed serves only entries still fresh (within ``cache_ttl_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from aiohttp import web
from redis.asyncio.client import PubSub

from services.common.clock import Clock
from services.common.errors import AuthenticationFailed, PermissionDenied, Unavailable
from services.common.logs import event
from services.edge.breaker import Breaker, BreakerOpen
from services.edge.counters import EdgeCounters
from services.edge.httperrors import Interrupted, KeyRevoked, TenantDisabled
from services.edge.redisconn import REDIS_FAILURES, RedisClient, open_pubsub
from services.edge.tenancy.apikeys import KeyHasher, KeyRecord, looks_like_key
from services.edge.tenancy.directory import EVENTS_CHANNEL, Directory
from services.edge.tenancy.tenants import Limits, Tenant

log = logging.getLogger("meridian.edge.auth")

_DISABLED = "The organization of this API key is disabled."
_REVOKED = "The API key of this request was revoked while the request ran."
_EXPIRED = (
    "The API key of this request expired while the request ran (its rotation grace period, "
    "or its own expiry, ended)."
)

_NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


@dataclass(frozen=True, slots=True)
class Principal:
    key: KeyRecord
    tenant: Tenant
    #: The key's HMAC digest (what Redis and the invalidation events name it by; never the
    #: key itself): a request in flight is matched against a key event by it.
    digest: str = ""

    @property
    def key_limits(self) -> Limits:
        return self.key.limits if self.key.limits is not None else self.tenant.key_limits


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthConfig:
    cache_ttl_s: float = 2.0
    stale_ttl_s: float = 300.0
    negative_ttl_s: float = 1.0
    max_entries: int = 100_000
    max_negative_entries: int = 10_000

    def __post_init__(self) -> None:
        if not 0 < self.cache_ttl_s <= self.stale_ttl_s:
            raise ValueError("need 0 < cache_ttl_s <= stale_ttl_s")
        if not 0 <= self.negative_ttl_s <= self.cache_ttl_s:
            raise ValueError("need 0 <= negative_ttl_s <= cache_ttl_s")
        if self.max_entries < 1 or self.max_negative_entries < 1:
            raise ValueError("cache sizes must be >= 1")


@dataclass(slots=True)
class _Entry:
    principal: Principal
    fresh_until: float
    stale_until: float


def bearer_token(request: web.Request) -> str:
    """The key from ``Authorization: Bearer <key>``; raises if absent or malformed.

    Two Authorization headers are refused rather than one picked: a proxy and a client that
    each add one must not have the edge guess whose key pays."""
    headers = request.headers.getall("Authorization", [])
    if len(headers) > 1:
        raise AuthenticationFailed(
            f"Send one Authorization header; this request has {len(headers)}.",
            code="invalid_authorization",
        )
    header = headers[0] if headers else ""
    scheme, _, token = header.partition(" ")
    if not header.strip():
        raise AuthenticationFailed(_NO_KEY, code=None)
    if scheme.lower() != "bearer":
        raise AuthenticationFailed(
            "The Authorization header must use the Bearer scheme: send the API key as "
            "'Authorization: Bearer YOUR_KEY'.",
            code="invalid_authorization",
        )
    if not token.strip():
        raise AuthenticationFailed(_NO_KEY, code=None)
    return token.strip()


class Authenticator:
    def __init__(
        self,
        *,
        directory: Directory,
        hasher: KeyHasher,
        clock: Clock,
        breaker: Breaker,
        counters: EdgeCounters,
        config: AuthConfig | None = None,
        serve_stale: bool = True,
    ) -> None:
        self._directory = directory
        self._serve_stale = serve_stale
        self._hasher = hasher
        self._clock = clock
        self._breaker = breaker
        self._counters = counters
        self._config = config or AuthConfig()
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._negative: dict[str, float] = {}
        self._loading: dict[str, asyncio.Task[Principal | None]] = {}
        #: Told of every invalidation after it is applied, as (kind, value): ``key``/digest,
        #: ``tenant``/id, or ``all`` (events may have been missed).
        self.on_change: Callable[[str, str], None] | None = None

    async def from_request(self, request: web.Request) -> Principal:
        try:
            raw = bearer_token(request)
        except AuthenticationFailed:
            self._counters.auth_missing += 1
            raise
        return await self.verify(raw)

    async def verify(self, raw: str) -> Principal:
        if not looks_like_key(raw):
            self._counters.auth_malformed += 1
            raise AuthenticationFailed(
                "Incorrect API key provided: the key is not in Meridian's format."
            )
        digest = self._hasher.digest(raw)
        now = self._clock.monotonic()
        entry = self._cache.get(digest)
        if entry is not None and entry.fresh_until > now:
            self._counters.auth_cache_hits += 1
            self._cache.move_to_end(digest)
            return self._check(entry.principal)
        negative_until = self._negative.get(digest)
        if negative_until is not None and negative_until > now:
            self._counters.auth_cache_hits += 1
            return self._refuse()
        principal: Principal | None = None
        try:
            principal = await self._lookup(digest)
        except REDIS_FAILURES as err:
            entry = self._cache.get(digest)
            if (
                self._serve_stale
                and entry is not None
                and entry.stale_until > self._clock.monotonic()
            ):
                self._counters.auth_stale_served += 1
                return self._check(entry.principal)
            self._counters.auth_unavailable += 1
            event(log, "auth.unavailable", level=logging.WARNING, error=type(err).__name__)
            raise Unavailable(
                "authentication is temporarily unavailable", retry_after_s=1.0
            ) from None
        if principal is None:
            return self._refuse()
        return self._check(principal)

    def _check(self, principal: Principal) -> Principal:
        if not principal.key.usable(int(self._clock.time() * 1000)):
            return self._refuse()
        if principal.tenant.disabled:
            self._counters.auth_disabled_tenant += 1
            raise PermissionDenied(_DISABLED, code="tenant_disabled")
        return principal

    def _refuse(self) -> Principal:
        self._counters.auth_invalid += 1
        raise AuthenticationFailed("Incorrect API key provided.")

    async def _lookup(self, digest: str) -> Principal | None:
        """One Redis lookup per digest at a time, in its own task: concurrent callers share
        it, and a caller that goes away does not cancel it for the others."""
        task = self._loading.get(digest)
        if task is None:
            if not self._breaker.allow():
                raise BreakerOpen("the Redis breaker is open")
            task = asyncio.create_task(self._load_and_remember(digest))
            self._loading[digest] = task
            task.add_done_callback(lambda t: self._loaded(digest, t))
        return await asyncio.shield(task)

    def _loaded(self, digest: str, task: asyncio.Task[Principal | None]) -> None:
        self._loading.pop(digest, None)
        if not task.cancelled():
            task.exception()  # retrieved here, so an unawaited failure is not reported twice

    async def _load_and_remember(self, digest: str) -> Principal | None:
        principal = await self._breaker.call(partial(self._load, digest))
        self._remember(digest, principal)
        return principal

    async def _load(self, digest: str) -> Principal | None:
        self._counters.auth_lookups += 1
        record = await self._directory.load_key(digest)
        if record is None or not record.usable(int(self._clock.time() * 1000)):
            return None
        tenant = await self._directory.get_tenant(record.tenant)
        if tenant is None:
            return None
        return Principal(key=record, tenant=tenant, digest=digest)

    def _remember(self, digest: str, principal: Principal | None) -> None:
        now = self._clock.monotonic()
        cfg = self._config
        if principal is None:
            self._cache.pop(digest, None)
            if len(self._negative) >= cfg.max_negative_entries:
                self._negative.clear()
            self._negative[digest] = now + cfg.negative_ttl_s
            return
        self._negative.pop(digest, None)
        self._cache[digest] = _Entry(principal, now + cfg.cache_ttl_s, now + cfg.stale_ttl_s)
        self._cache.move_to_end(digest)
        while len(self._cache) > cfg.max_entries:
            self._cache.popitem(last=False)

    # Invalidation ----------------------------------------------------------------------------

    def invalidate(self, message: str) -> None:
        """Apply one event from :data:`EVENTS_CHANNEL` (``key:{digest}``/``tenant:{id}``).

        A key event drops the entry (it may be revoked: it must not be served stale either);
        a tenant event only marks its keys for re-verification, so they can still be served
        stale if Redis goes away right after.
        """
        self._counters.auth_invalidations += 1
        kind, _, value = message.partition(":")
        if kind == "key":
            self._cache.pop(value, None)
            self._negative.pop(value, None)
            self._changed("key", value)
        elif kind == "tenant":
            for entry in self._cache.values():
                if entry.principal.tenant.tenant_id == value:
                    entry.fresh_until = 0.0
            self._changed("tenant", value)
        else:
            self.expire_all()

    def expire_all(self) -> None:
        """Re-verify every key on next use (events may have been missed)."""
        for entry in self._cache.values():
            entry.fresh_until = 0.0
        self._negative.clear()
        self._changed("all", "")

    def _changed(self, kind: str, value: str) -> None:
        if self.on_change is not None:
            self.on_change(kind, value)

    async def recheck(self, digest: str) -> Interrupted | None:
        """Whether a request already admitted under this key may go on: the error to end it
        with when its key is revoked, expired or gone, or its tenant disabled; None when it
        may (or when Redis cannot tell now: a running request is not ended on a guess)."""
        known = self._cache.get(digest)
        try:
            principal = await self._lookup(digest)
        except REDIS_FAILURES as err:
            event(log, "auth.recheck_unavailable", level=logging.WARNING, error=type(err).__name__)
            return None
        now_ms = int(self._clock.time() * 1000)
        if principal is None or not principal.key.usable(now_ms):
            record = principal.key if principal is not None else None
            if record is None and known is not None:
                record = known.principal.key
            if (
                record is not None
                and record.revoked_ms is None
                and record.expires_ms is not None
                and record.expires_ms <= now_ms
            ):
                return KeyRevoked(_EXPIRED)
            return KeyRevoked(_REVOKED)
        if principal.tenant.disabled:
            return TenantDisabled(_DISABLED)
        return None

    def expires_ms(self, digest: str) -> int | None:
        """When the cached key of ``digest`` stops working (epoch ms; a rotation's grace or
        its own expiry), None if it does not or is not cached."""
        entry = self._cache.get(digest)
        return entry.principal.key.expires_ms if entry is not None else None

    async def listen(self, client: RedisClient, stop: asyncio.Event) -> None:
        """Follow :data:`EVENTS_CHANNEL` until ``stop``; reconnects with backoff.

        After every (re)subscription all entries are expired: messages sent while this edge
        was not listening are lost, and re-verifying is cheap.
        """
        backoff = 0.1
        while not stop.is_set():
            pubsub: PubSub | None = None
            try:
                pubsub = await open_pubsub(client)
                await pubsub.subscribe(EVENTS_CHANNEL)
                self.expire_all()
                backoff = 0.1
                while not stop.is_set():
                    msg = await pubsub.get_message(timeout=0.5)
                    if msg is not None and msg.get("type") == "message":
                        data = msg["data"]
                        self.invalidate(data.decode() if isinstance(data, bytes) else str(data))
            except REDIS_FAILURES as err:
                event(log, "auth.events_lost", level=logging.DEBUG, error=type(err).__name__)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(*REDIS_FAILURES):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py
