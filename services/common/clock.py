"""Time, passed in rather than read from globals, so windows, EWMAs, heartbeats and rate limits
are tested deterministically (``ManualClock``) and run on the real clock in production."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (intervals, deadlines)."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch (timestamps that cross processes)."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to: the real implementation tests use."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1.7e9) -> None:
        self._now = start
        self._wall_offset = wall_offset

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds


SYSTEM_CLOCK = SystemClock()
