"""A circuit breaker for one dependency (Redis), shared by everything that calls it.

Why: when Redis is down, every request would otherwise wait for a connect or socket timeout
before falling back. After a failure the breaker *opens* for ``open_for_s``: callers skip the
dependency and go straight to their failure policy. When that time has passed, calls are let
through again (half-open); the first success closes it, a failure opens it for another
period. Recovery therefore needs no restart, and costs at most one failed call per period.

:meth:`Breaker.call` is the one way to call Redis through it. It also tells the edge's own
stalls from Redis's: a timeout during which this process's event loop could not run for at
least half the wait (a long GC pass, a CPU-starved machine; see
:class:`services.common.loopwatch.LoopWatch`) most likely measured the edge, not Redis — the
reply was waiting in the socket — so it is not held against Redis: the call is made once more
at once, and only a second failure opens the breaker. Without this, a busy edge would open
its breaker and fall back to its failure policy (for the rate limiter: this replica's own
windows, so limits overrun across replicas) exactly when it is loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.exceptions

from services.common.clock import Clock
from services.common.logs import event
from services.common.loopwatch import LoopWatch
from services.edge.counters import EdgeCounters
from services.edge.redisconn import REDIS_FAILURES

log = logging.getLogger("meridian.edge.redis")

T = TypeVar("T")

_TIMEOUTS = (redis.exceptions.TimeoutError, TimeoutError)
FAILURES = REDIS_FAILURES
#: A timeout is the edge's own when its loop was stalled for at least this share of the wait.
_STALLED_SHARE = 0.5


class BreakerOpen(redis.exceptions.ConnectionError):
    """The breaker is open: Redis was not called (callers treat it as Redis being down)."""


class Breaker:
    def __init__(
        self,
        *,
        clock: Clock,
        counters: EdgeCounters,
        open_for_s: float = 1.0,
        watch: LoopWatch | None = None,
    ) -> None:
        if not open_for_s > 0:
            raise ValueError("open_for_s must be > 0")
        self._clock = clock
        self._watch = watch
        self._counters = counters
        self._open_for_s = open_for_s
        self._open_until: float | None = None

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def allow(self) -> bool:
        """Whether to call the dependency now (closed, or open long enough to try again)."""
        return self._open_until is None or self._clock.monotonic() >= self._open_until

    def success(self) -> None:
        self._open_until = None

    def failure(self) -> None:
        if self._open_until is None:
            self._counters.redis_breaker_opened += 1
        self._open_until = self._clock.monotonic() + self._open_for_s

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` through the breaker: :class:`BreakerOpen` while it is open; a failure
        (any Redis or socket error) opens it, a success closes it. A timeout that the edge's
        own stall explains is retried once at once (see the module docstring), so ``fn`` must
        be safe to repeat: the limiter's scripts are idempotent per request id."""
        if not self.allow():
            raise BreakerOpen("the Redis breaker is open")
        mark = self._watch.mark() if self._watch is not None else 0.0
        try:
            result = await fn()
        except _TIMEOUTS:
            if not self._stalled_through(mark):
                self.failure()
                raise
            try:
                result = await fn()
            except FAILURES:
                self.failure()
                raise
        except FAILURES:
            self.failure()
            raise
        self.success()
        return result

    def _stalled_through(self, mark: float) -> bool:
        """Whether this process's loop was stalled for most of the wait since ``mark``."""
        watch = self._watch
        if watch is None:
            return False
        waited = watch.mark() - mark
        stalled = watch.stalled_since(mark)
        if stalled < _STALLED_SHARE * waited:
            return False
        self._counters.redis_timeouts_in_stalls += 1
        event(
            log,
            "redis.timeout_in_stall",
            level=logging.WARNING,
            waited_ms=round(waited * 1000),
            stalled_ms=round(stalled * 1000),
        )
        return True
