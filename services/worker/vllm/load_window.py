"""An engine's load as the router wants it: the latest queue state plus recent-window rates.

Fed once per engine step (services/worker/vllm/stats.py does it from vLLM's stat loggers)
and read by every load report, so both sides are O(1) amortised.

- ``running``, ``waiting``, ``kv_cache_usage``: the latest step's values. An idle engine takes
  no steps, so these are the values of its last step, which after the last request finished
  are zeros: correct, not stale.
- ``tokens_per_second`` = generated tokens observed in the last ``window_s`` seconds divided by
  ``window_s`` (by the time since the window opened, while that is shorter). It is computed at
  read time, so it decays to 0 once the engine goes quiet instead of freezing at the last rate.
- ``prefix_cache_hit_rate`` = prefix-cache hit tokens / queried tokens over the same window,
  0 when nothing was queried in it.

Time comes from the clock passed in (services/common/clock.py), so tests drive the window
with a ``ManualClock``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from services.common.clock import Clock


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    tokens_per_second: float = 0.0
    prefix_cache_hit_rate: float = 0.0


class LoadWindow:
    """Latest scheduler state and sliding-window sums of tokens and prefix-cache lookups."""

    def __init__(self, *, window_s: float, clock: Clock) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self._window_s = window_s
        self._clock = clock
        self._opened = clock.monotonic()
        self._running = 0
        self._waiting = 0
        self._kv_cache_usage = 0.0
        # (time, generated tokens, prefix-cache queried tokens, prefix-cache hit tokens)
        self._events: deque[tuple[float, int, int, int]] = deque()
        self._tokens = 0
        self._queries = 0
        self._hits = 0

    def observe_scheduler(
        self,
        *,
        running: int,
        waiting: int,
        kv_cache_usage: float,
        prefix_queries: int = 0,
        prefix_hits: int = 0,
    ) -> None:
        """One engine step's scheduler state and the prefix-cache lookups made in it."""
        self._running = max(0, running)
        self._waiting = max(0, waiting)
        self._kv_cache_usage = min(1.0, max(0.0, kv_cache_usage))
        if prefix_queries > 0:
            hits = max(0, min(prefix_hits, prefix_queries))
            self._add(tokens=0, queries=prefix_queries, hits=hits)

    def observe_tokens(self, generated: int) -> None:
        """Tokens generated in one engine step."""
        if generated > 0:
            self._add(tokens=generated, queries=0, hits=0)

    def snapshot(self) -> LoadSnapshot:
        now = self._clock.monotonic()
        self._expire(now)
        span = min(self._window_s, now - self._opened)
        return LoadSnapshot(
            running=self._running,
            waiting=self._waiting,
            kv_cache_usage=self._kv_cache_usage,
            tokens_per_second=self._tokens / span if span > 0 else 0.0,
            prefix_cache_hit_rate=self._hits / self._queries if self._queries else 0.0,
        )

    def _add(self, *, tokens: int, queries: int, hits: int) -> None:
        now = self._clock.monotonic()
        self._events.append((now, tokens, queries, hits))
        self._tokens += tokens
        self._queries += queries
        self._hits += hits
        self._expire(now)

    def _expire(self, now: float) -> None:
        horizon = now - self._window_s
        events = self._events
        while events and events[0][0] <= horizon:
            _, tokens, queries, hits = events.popleft()
            self._tokens -= tokens
            self._queries -= queries
            self._hits -= hits
