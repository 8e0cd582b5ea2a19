"""A circuit breaker for one dependency (Redis), shared by everything that calls it.

Why: when Redis is down, every request would otherwise wait for a connect or socket timeout
before falling back. After a failure the breaker *opens* for ``open_for_s``: callers skip the
dependency and go straight to their failure policy. When that time has passed, calls are let
through again (half-open); the first success closes it, a failure opens it for another
period. Recovery therefore needs no restart, and costs at most one failed call per period.
"""

from __future__ import annotations

from services.common.clock import Clock
from services.edge.counters import EdgeCounters


class Breaker:
    def __init__(self, *, clock: Clock, counters: EdgeCounters, open_for_s: float = 1.0) -> None:
        if not open_for_s > 0:
            raise ValueError("open_for_s must be > 0")
        self._clock = clock
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
