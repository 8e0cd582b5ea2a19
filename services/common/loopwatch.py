"""How long this process's event loop could not run anything: the edge's own stalls, told
apart from a slow dependency.

Why: a Redis call's deadline is wall-clock time, and the wall clock runs on while the event
loop itself is stalled — a long garbage-collection pass, a CPU-starved machine, a burst of
CPU-bound callbacks. A reply that reached the socket in time but waited for the loop times
out exactly like a slow server, and a caller that then opens its breaker and falls back (for
the rate limiter: admits on this replica's own windows) degrades *because it was busy*, which
is when its limits matter most. :class:`LoopWatch` ticks every ``interval_s``; a tick that
runs late records the lateness as stalled time, so a caller whose call timed out can ask
"how much of that wait was ours?" (:meth:`LoopWatch.stalled_since`) and retry instead.

The cost is one timer wake-up per interval (10 a second by default: a wake-up of a gRPC
server's loop costs ~100 µs of CPU, measured with ``bench.router_cpu_ab``). A stall is seen
less the part of it before the first tick it delays — at most one interval, which is small
against the waits it explains (a 1 s Redis timeout, a 600 ms report-staleness limit).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

#: A tick records nothing unless it ran at least this late: the scheduler's ordinary jitter
#: is not a stall.
_MIN_LATENESS_S = 0.002


class LoopWatch:
    def __init__(
        self,
        *,
        interval_s: float = 0.1,
        horizon_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < interval_s <= 1:
            raise ValueError("interval_s must be in (0, 1]")
        if not horizon_s >= interval_s:
            raise ValueError("horizon_s must be >= interval_s")
        self._interval_s = interval_s
        self._horizon_s = horizon_s
        self._clock = clock
        #: Stalls seen, oldest first: (when the late tick finally ran, how late it was).
        self._stalls: deque[tuple[float, float]] = deque()
        self._due: float | None = None  # when the running tick should wake; None: not running
        self.worst_s = 0.0  # the longest stall seen (for the metrics)
        self.total_s = 0.0  # all stalled time seen

    def mark(self) -> float:
        """Now, on the watch's clock: pass it to :meth:`stalled_since` after the call."""
        return self._clock()

    def stalled_since(self, mark: float) -> float:
        """Seconds, since ``mark``, that the loop could not run a ready timer, counting a
        stall still going on (the tick that would end it has not run yet)."""
        now = self._clock()
        stalled = 0.0
        for ended, late in reversed(self._stalls):
            if ended <= mark:
                break
            stalled += ended - max(mark, ended - late)
        if self._due is not None and now - self._due > _MIN_LATENESS_S:
            stalled += now - max(mark, self._due)
        return max(0.0, stalled)

    def record(self, ended: float, late_s: float) -> None:
        """One tick that ran ``late_s`` late, at ``ended`` (public for tests and for callers
        that watch a loop of their own)."""
        if late_s < _MIN_LATENESS_S:
            return
        self._stalls.append((ended, late_s))
        self.worst_s = max(self.worst_s, late_s)
        self.total_s += late_s
        while self._stalls and self._stalls[0][0] < ended - self._horizon_s:
            self._stalls.popleft()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Tick until ``stop`` is set (or the task is cancelled)."""
        try:
            while stop is None or not stop.is_set():
                self._due = self._clock() + self._interval_s
                await asyncio.sleep(self._interval_s)
                ended = self._clock()
                self.record(ended, ended - self._due)
        finally:
            self._due = None
