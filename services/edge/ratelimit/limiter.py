"""The admission policy around the limit backends: what runs before Redis, what happens when
Redis is unreachable, and the life of a lease.

In order, for each request:

1. **Local checks, no Redis** (the local limit in front of the global one, to spare Redis
   from abusive traffic): a reservation larger than a scope's whole tpm can never pass
   (429 at once), and a scope that Redis recently refused on *requests per minute* stays
   refused here until the retry time Redis gave — exact, because in a sliding window no
   request slot frees before the oldest entry leaves it, whatever other replicas do. Exact
   *for that rpm* only: a refusal is remembered with the limit it was made under and the
   requests Redis counted, and is forgotten as soon as the scope's rpm differs (an admin
   raised or lowered it), so a new limit takes effect on the next request, not a minute
   later. (Token and stream refusals are not remembered: another replica's settle can free
   room at any moment.)
2. **Redis** (one script call), unless the shared breaker is open.
3. **Failure policy** when Redis failed or the breaker is open (both counted):
   ``open`` — decide on this replica's own windows, with each limit scaled by
   ``local_share`` (set it to 1/replicas to keep the sum near the global limit);
   ``closed`` — 503 with Retry-After.

An admitted request holds a :class:`Lease`. When the request ends (completed, failed or the
client went away) :meth:`RateLimiter.settle` replaces the reservation with the tokens really
used and frees the stream slot, in the background; live leases are renewed every
``renew_every_s`` so a long stream keeps its slot, and a crashed edge's slots expire after
``lease_ttl_s``. A settle that cannot reach Redis (an outage, a Sentinel failover) is kept
and sent again once Redis answers; after a failover, the settles of the last 30 s are sent
again to the new primary, at once and twice more within 5 s (the old one may have taken them
and lost them).

**What an outage admitted is charged back.** A request admitted fail-open counted only on this
replica's windows; Redis never saw it. So that the limit still holds over the window once
Redis answers again (rather than every replica's outage traffic vanishing, and a tenant
getting a full minute's quota on top), each such request is written into Redis's windows at
the time it was admitted (:data:`~.redis_backend.CHARGE_LUA`): when it ends, with the tokens
it used, through the same retrying queue as settles; while it still runs, its reservation and
stream slot are moved to Redis at the next renewal after Redis answers (the lease then lives
in Redis, as if Redis had admitted it), so other replicas see the streams that are open.
Entries whose window has passed by then are not written: they no longer count anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial

from services.common.clock import Clock
from services.common.errors import RateLimited, Unavailable
from services.common.logs import event
from services.edge.breaker import FAILURES, Breaker, BreakerOpen
from services.edge.counters import EdgeCounters
from services.edge.ratelimit.headers import (
    NO_RETRY,
    go_duration,
    rate_limit_headers,
    refusal_message,
)
from services.edge.ratelimit.redis_backend import Charge, RedisBackend
from services.edge.ratelimit.types import (
    Ask,
    LimiterBackend,
    Reason,
    Scope,
    ScopeState,
    Verdict,
)
from services.edge.ratelimit.window import LocalBackend

log = logging.getLogger("meridian.edge.ratelimit")

_MAX_DENIALS = 100_000
_MAX_QUEUED_SETTLES = 100_000
_SETTLE_BACKOFF_MIN_S = 0.05
_SETTLE_BACKOFF_MAX_S = 1.0
_RESETTLE_WINDOW_MS = 30_000
_RESETTLE_AGAIN_S = (0.0, 2.0, 5.0)


class FailureMode(StrEnum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimitConfig:
    window_s: float = 60.0
    lease_ttl_s: float = 30.0
    renew_every_s: float = 10.0
    failure_mode: FailureMode = FailureMode.OPEN
    local_share: float = 1.0
    #: Tokens reserved for the completion when a request does not set max_tokens.
    default_completion_tokens: int = 1024

    def __post_init__(self) -> None:
        if not self.window_s >= 1:
            raise ValueError("window_s must be >= 1")
        if not 0 < self.renew_every_s * 2 <= self.lease_ttl_s:
            raise ValueError("need 0 < renew_every_s <= lease_ttl_s / 2 (a renewal may be late)")
        if not 0 < self.local_share <= 1:
            raise ValueError("local_share must be in (0, 1]")
        if self.default_completion_tokens < 1:
            raise ValueError("default_completion_tokens must be >= 1")

    @property
    def window_ms(self) -> int:
        return int(self.window_s * 1000)

    @property
    def lease_ms(self) -> int:
        return int(self.lease_ttl_s * 1000)


@dataclass(frozen=True, slots=True)
class _Denial:
    """A Redis RPM refusal of one scope, remembered until its next free slot."""

    until_ms: int  # when the scope's oldest entry leaves the window
    rpm: int | None  # the limit it was refused under: a different one must ask Redis again
    used: int  # requests Redis counted in the window (none can leave it before until_ms)


class RateLimitExceeded(RateLimited):
    """A 429 that also carries the x-ratelimit-* headers of the refusing verdict."""

    def __init__(self, message: str, *, retry_after_s: float | None, headers: dict[str, str]):
        super().__init__(message, retry_after_s=retry_after_s)
        self.headers = headers


@dataclass(slots=True, eq=False)
class Lease:
    ask: Ask
    backend: LimiterBackend | None  # None: nothing was limited, nothing to settle
    headers: dict[str, str] = field(default_factory=dict)
    settled: bool = False
    #: Admitted on this replica's windows while Redis was out (ms): to be charged to Redis.
    fail_open_at_ms: int | None = None
    #: The tokens it used, once settled.
    used: int = 0


@dataclass(frozen=True, slots=True)
class _Write:
    """A write queued for Redis: a settle, or the charge of a request admitted fail-open."""

    ask: Ask
    used: int
    #: When its window entry was made (a settle: when queued, no later than that): once it
    #: is older than the window, the write would change nothing and is dropped.
    at_ms: int
    charge: bool = False


class RateLimiter:
    def __init__(
        self,
        *,
        redis: RedisBackend | None,
        local: LocalBackend,
        breaker: Breaker,
        counters: EdgeCounters,
        clock: Clock,
        config: RateLimitConfig,
    ) -> None:
        self._redis = redis
        self._local = local
        self._breaker = breaker
        self._counters = counters
        self._clock = clock
        self.config = config
        self._denied: dict[str, _Denial] = {}  # scope id -> its remembered RPM refusal
        self._live: set[Lease] = set()
        self._pending: set[asyncio.Task[None]] = set()
        # Redis writes waiting for the flusher: settles and fail-open charges.
        self._to_settle: list[_Write] = []
        # Writes Redis acknowledged lately, sent again after a failover.
        self._sent: deque[_Write] = deque(maxlen=_MAX_QUEUED_SETTLES)
        # Live leases admitted fail-open, whose reservation and slot Redis does not hold yet.
        self._unadopted: set[Lease] = set()
        self._adopting: asyncio.Task[None] | None = None
        self._primary_seen = redis.primary() if redis is not None else None
        self._resettle_due: list[float] = []  # monotonic times of resends still to come
        self._closing = False
        self._flusher: asyncio.Task[None] | None = None

    def _now_ms(self) -> int:
        return int(self._clock.time() * 1000)

    @property
    def live_leases(self) -> int:
        return len(self._live)

    async def admit(self, ask: Ask) -> Lease:
        """A lease for ``ask``, or RateLimitExceeded (429) / Unavailable (503, fail-closed)."""
        limited = tuple(s for s in ask.scopes if not s.limits.unlimited())
        if not limited:
            self._counters.admitted += 1
            return Lease(ask, None)
        ask = Ask(ask.request_id, ask.tokens, limited)
        now_ms = self._now_ms()
        self._check_locally(ask, now_ms)
        backend, ask, verdict = await self._decide(ask, now_ms)
        if backend is self._redis and self._unadopted:
            self._adopt_soon()  # Redis answers again: move the outage's live leases to it
        headers = rate_limit_headers(ask, verdict)
        if not verdict.admitted:
            self._refused(ask, verdict, now_ms, remember=backend is self._redis)
            raise RateLimitExceeded(
                refusal_message(ask, verdict),
                retry_after_s=verdict.retry_after_ms / 1000 if verdict.retry_after_ms else None,
                headers=headers,
            )
        self._counters.admitted += 1
        lease = Lease(ask, backend, headers)
        self._live.add(lease)
        if backend is self._local and self._redis is not None:
            lease.fail_open_at_ms = now_ms
            self._unadopted.add(lease)
        return lease

    def _check_locally(self, ask: Ask, now_ms: int) -> None:
        for scope in ask.scopes:
            tpm = scope.limits.tpm
            if tpm is not None and ask.tokens > tpm:
                verdict = Verdict(False, (), Reason.TOO_LARGE, 0, 0)
                self._counters.rate_limited_too_large += 1
                raise RateLimitExceeded(
                    refusal_message(Ask(ask.request_id, ask.tokens, (scope,)), _at(verdict)),
                    retry_after_s=None,
                    headers=dict(NO_RETRY),
                )
            denial = self._denied.get(scope.id)
            if denial is None:
                continue
            if denial.until_ms <= now_ms or denial.rpm != scope.limits.rpm:
                del self._denied[scope.id]  # a slot is free, or the limit changed: ask Redis
                continue
            self._counters.rate_limited_requests += 1
            self._counters.rate_limited_locally += 1
            raise _requests_refusal(scope, denial, now_ms)

    async def _decide(self, ask: Ask, now_ms: int) -> tuple[LimiterBackend, Ask, Verdict]:
        if self._redis is None:
            return self._local, ask, self._local.admit_now(ask, now_ms)
        try:
            verdict = await self._breaker.call(partial(self._redis.admit, ask, now_ms))
        except BreakerOpen:
            pass  # Redis is known to be down: straight to the failure policy
        except FAILURES as err:
            self._counters.limiter_redis_errors += 1
            event(log, "ratelimit.redis_error", level=logging.WARNING, error=type(err).__name__)
        else:
            return self._redis, ask, verdict
        if self.config.failure_mode is FailureMode.CLOSED:
            self._counters.limiter_fail_closed += 1
            raise Unavailable("rate limiting is temporarily unavailable", retry_after_s=1.0)
        self._counters.limiter_fail_open += 1
        share = self.config.local_share
        local_ask = Ask(
            ask.request_id,
            ask.tokens,
            tuple(
                Scope(s.kind, s.name, s.id, s.limits.scaled(share) if share < 1 else s.limits)
                for s in ask.scopes
            ),
        )
        return self._local, local_ask, self._local.admit_now(local_ask, now_ms)

    def _refused(self, ask: Ask, verdict: Verdict, now_ms: int, *, remember: bool) -> None:
        """Count a refusal; remember Redis's RPM refusals (the local fallback's windows are
        this replica's guess and must not outlive an outage)."""
        reason = verdict.reason
        if reason is Reason.REQUESTS:
            self._counters.rate_limited_requests += 1
            if not remember:
                return
            if len(self._denied) >= _MAX_DENIALS:
                self._denied.clear()
            # Remember the refusing scope until *its own* next free slot (its oldest entry
            # leaving the window), not the verdict's overall retry, which may be longer.
            scope = ask.scopes[verdict.scope_index]
            state = verdict.states[verdict.scope_index]
            if state.reset_ms > 0:
                self._denied[scope.id] = _Denial(
                    now_ms + state.reset_ms, scope.limits.rpm, state.requests
                )
        elif reason is Reason.TOKENS:
            self._counters.rate_limited_tokens += 1
        elif reason is Reason.STREAMS:
            self._counters.rate_limited_streams += 1
        else:
            self._counters.rate_limited_too_large += 1

    def settle(self, lease: Lease, used_tokens: int) -> None:
        """Reconcile the reservation with ``used_tokens`` and free the stream slot, in the
        background: the response never waits for it, and a cancelled handler can call it.

        Redis settles are *group-committed*: one is sent at once; those that arrive while it
        is in flight go together in the next pipelined round trip. No delay is added, and
        under load the per-request cost of settling shrinks.
        """
        if lease.settled:
            return
        lease.settled = True
        self._live.discard(lease)
        self._unadopted.discard(lease)
        used = lease.used = max(0, used_tokens)
        if lease.backend is None:
            return
        if lease.backend is self._redis:
            self._queue_settles([_Write(lease.ask, used, self._now_ms())])
            return
        if lease.fail_open_at_ms is not None:
            self._queue_settles([_Write(lease.ask, used, lease.fail_open_at_ms, charge=True)])
        task = asyncio.get_running_loop().create_task(self._settle_one(lease.backend, lease, used))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _queue_settles(self, items: list[_Write]) -> None:
        self._to_settle.extend(items)
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_settles())

    def _resettle_after_failover(self, *, now_too: bool = False) -> None:
        """If another server takes our writes now (a Sentinel failover), send the settles of
        the last ``_RESETTLE_WINDOW_MS`` again: the old primary may have acknowledged them
        after a replica was promoted, and lost them when it became a replica itself. They
        are sent at once and again ``_RESETTLE_AGAIN_S`` later (until every sentinel agrees,
        a connection may still reach the old primary); settling twice is harmless."""
        if self._redis is None:
            return
        now = self._clock.monotonic()
        primary = self._redis.primary()
        if primary != self._primary_seen:
            first, self._primary_seen = self._primary_seen is None, primary
            if not first:  # the first connection is not a failover
                self._resettle_due = [now + delay for delay in _RESETTLE_AGAIN_S]
        if not self._resettle_due or (self._resettle_due[0] > now and not now_too):
            return
        self._resettle_due = [t for t in self._resettle_due if t > now and not now_too]
        oldest = self._now_ms() - _RESETTLE_WINDOW_MS
        again = [item for item in self._sent if item.at_ms >= oldest]
        self._sent.clear()
        if again:
            self._counters.settles_resent += len(again)
            event(log, "ratelimit.resettle_after_failover", requests=len(again))
            self._queue_settles(again)

    async def _settle_one(self, backend: LimiterBackend, lease: Lease, used: int) -> None:
        try:
            await backend.settle(lease.ask, used, self._now_ms())
        except FAILURES as err:
            self._counters.settle_failures += 1
            event(log, "ratelimit.settle_failed", level=logging.WARNING, error=type(err).__name__)

    async def _flush_settles(self) -> None:
        """Send queued Redis settles until none is left. A batch that cannot reach Redis (an
        outage, a Sentinel failover, a breaker that is open) is kept and sent again with
        backoff, so no reservation stays charged once Redis is back; settling twice is
        harmless (the script sets the used tokens, it does not add them). A settle is dropped
        (counted in ``settle_failures``) only when its entry has left the window anyway, or
        when the edge shuts down before Redis returns."""
        backoff_s = _SETTLE_BACKOFF_MIN_S
        try:
            while self._to_settle and self._redis is not None:
                batch, self._to_settle = self._expired_settles_dropped(self._to_settle), []
                if not batch:
                    continue
                try:
                    await self._breaker.call(partial(self._write, self._redis, batch))
                except BreakerOpen:
                    pass
                except FAILURES as err:
                    event(
                        log,
                        "ratelimit.settle_failed",
                        level=logging.WARNING,
                        error=type(err).__name__,
                        requests=len(batch),
                    )
                else:
                    backoff_s = _SETTLE_BACKOFF_MIN_S
                    charged = sum(1 for w in batch if w.charge)
                    if charged:
                        self._counters.limiter_charged_back += charged
                        event(log, "ratelimit.charged_back", requests=charged)
                    self._sent.extend(batch)
                    self._resettle_after_failover()
                    continue
                if self._closing:
                    self._counters.settle_failures += len(batch)
                    continue
                self._counters.settle_retries += len(batch)
                self._to_settle[:0] = batch
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, _SETTLE_BACKOFF_MAX_S)
        finally:
            self._flusher = None

    async def _write(self, redis: RedisBackend, batch: list[_Write]) -> None:
        """One batch of queued writes: its settles in one round trip, its charges in one."""
        now_ms = self._now_ms()
        settles = [(w.ask, w.used) for w in batch if not w.charge]
        charges = [Charge(w.ask, w.used, w.at_ms, live=False) for w in batch if w.charge]
        if settles:
            await redis.settle_many(settles, now_ms)
        if charges:
            await redis.charge_many(charges, now_ms)

    def _expired_settles_dropped(self, queued: list[_Write]) -> list[_Write]:
        """The queued writes whose entries are still in the window (and at most
        ``_MAX_QUEUED_SETTLES`` of them, the newest); the others are counted and dropped (a
        settle as failed; a charge as dropped: its request no longer counts anyway)."""
        oldest = self._now_ms() - self.config.window_ms
        fresh = [item for item in queued if item.at_ms >= oldest]
        over = max(0, len(fresh) - _MAX_QUEUED_SETTLES)
        dropped = [item for item in queued if item.at_ms < oldest] + fresh[:over]
        charges = sum(1 for item in dropped if item.charge)
        self._counters.limiter_charges_dropped += charges
        self._counters.settle_failures += len(dropped) - charges
        return fresh[over:]

    def _adopt_soon(self) -> asyncio.Task[None] | None:
        """Start moving the outage's live leases to Redis, unless that is under way."""
        if self._adopting is None and not self._closing:
            self._adopting = asyncio.get_running_loop().create_task(self._adopt_live())
        return self._adopting

    async def _adopt_live(self) -> None:
        """Move the live leases admitted fail-open to Redis (see the module's docstring): their
        reservations and stream slots are written there, then their local slots freed, and
        from then on they renew and settle in Redis. A lease that ends during the write has
        queued its charge already; it is queued once more here (charging is idempotent) so
        that the slot just taken in Redis is freed whichever write lands last."""
        try:
            redis = self._redis
            leases = [x for x in self._unadopted if not x.settled]
            if redis is None or not leases:
                return
            now_ms = self._now_ms()
            charges = [
                Charge(x.ask, x.ask.tokens, x.fail_open_at_ms or now_ms, live=True) for x in leases
            ]
            try:
                await self._breaker.call(partial(redis.charge_many, charges, now_ms))
            except BreakerOpen:
                return
            except FAILURES as err:
                event(
                    log, "ratelimit.adopt_failed", level=logging.WARNING, error=type(err).__name__
                )
                return
            ended = []
            for lease in leases:
                self._unadopted.discard(lease)
                if lease.settled:
                    at_ms = lease.fail_open_at_ms or now_ms
                    ended.append(_Write(lease.ask, lease.used, at_ms, charge=True))
                    continue
                lease.backend = redis
                await self._local.settle(lease.ask, lease.ask.tokens, now_ms)
            self._counters.limiter_leases_adopted += len(leases) - len(ended)
            event(log, "ratelimit.leases_adopted", requests=len(leases) - len(ended))
            if ended:
                self._queue_settles(ended)
        finally:
            self._adopting = None

    async def renew_once(self) -> None:
        """Extend the leases of live requests (moving those admitted fail-open to Redis once
        it answers); sweep idle local state."""
        self._resettle_after_failover()
        if self._unadopted and self._adopting is None:
            adopting = self._adopt_soon()
            if adopting is not None:
                await adopting
        now_ms = self._now_ms()
        self._local.sweep(now_ms)
        await self._local.renew([x.ask for x in self._live if x.backend is self._local], now_ms)
        if self._redis is None:
            return
        asks = [x.ask for x in self._live if x.backend is self._redis]
        if not asks:
            return
        try:
            await self._breaker.call(partial(self._redis.renew, asks, now_ms))
        except BreakerOpen:
            return
        except FAILURES as err:
            self._counters.lease_renew_failures += 1
            event(log, "ratelimit.renew_failed", level=logging.WARNING, error=type(err).__name__)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.renew_every_s)
            if not stop.is_set():
                await self.renew_once()

    async def close(self, timeout_s: float = 2.0) -> None:
        """Wait (briefly) for settles still in flight: each queued Redis settle gets one more
        try, and those that still cannot reach Redis are counted as failed."""
        self._closing = True
        self._resettle_after_failover(now_too=True)  # resends still due: now, one last time
        waiting = set(self._pending)
        if self._adopting is not None:
            waiting.add(self._adopting)
        if self._flusher is not None:
            waiting.add(self._flusher)
        if waiting:
            await asyncio.wait(waiting, timeout=timeout_s)
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        self._counters.settle_failures += len(self._to_settle)
        self._to_settle.clear()


def _at(verdict: Verdict) -> Verdict:
    """``verdict`` with one placeholder state, for messages about a single scope."""
    return Verdict(
        verdict.admitted,
        (ScopeState(0, 0, 0, 0),),
        verdict.reason,
        0,
        verdict.retry_after_ms,
    )


def _requests_refusal(scope: Scope, denial: _Denial, now_ms: int) -> RateLimitExceeded:
    """The 429 of a remembered refusal, worded as Redis's own (the requests it counted)."""
    rpm, retry_ms = denial.rpm, denial.until_ms - now_ms
    return RateLimitExceeded(
        f"Rate limit reached for requests per minute (RPM) on {scope.kind} {scope.name}: "
        f"Limit {rpm}, Used {denial.used}, Requested 1. "
        f"Please try again in {go_duration(retry_ms)}.",
        retry_after_s=retry_ms / 1000,
        headers={
            "x-ratelimit-limit-requests": str(rpm),
            "x-ratelimit-remaining-requests": str(max(0, (rpm or 0) - denial.used)),
            "x-ratelimit-reset-requests": go_duration(retry_ms),
        },
    )
