"""Meters for time the test process lost, so a timing bound measures the code, not the machine.

Tests here share one process (and often one event loop) among the services they start. A
starved CI machine, or a full garbage collection over the suite's heap, can hold everything up
for half a second; a bound meant for the code under test then fails on the machine. Two meters
tell the cases apart:

- :class:`LoopStalls` — how long the running event loop was held up (anything on the loop that
  did not yield, plus whatever held the whole process);
- :class:`ProcessStalls` — how long the whole process was held up: a thread that needs only
  the GIL and the CPU. Python work on the event loop that runs long without yielding still
  lets it run (the interpreter switches threads every few milliseconds), so this meter does
  *not* see a blocked loop, only what held everything: that is what to subtract when the
  test's point is that the loop stays free.
"""

from __future__ import annotations

import asyncio
import threading
import time

from services.common.loopwatch import LoopWatch

#: Each meter asks to wake this often.
TICK_S = 0.01


class LoopStalls:
    """How long the running event loop was held up from now until :meth:`stop`: the
    services' own :class:`~services.common.loopwatch.LoopWatch`, ticking every 10 ms."""

    def __init__(self) -> None:
        self._watch = LoopWatch(interval_s=TICK_S)
        self._mark = self._watch.mark()
        self._task = asyncio.get_running_loop().create_task(self._watch.run())

    @property
    def held_s(self) -> float:
        """Seconds the loop has been held up so far."""
        return self._watch.stalled_since(self._mark)

    def stop(self) -> float:
        """Stops the meter; the seconds the loop was held up."""
        held = self.held_s
        self._task.cancel()
        return held


class ProcessStalls:
    """A daemon thread's 10-ms wake-ups: the total and the longest lateness beyond a slack
    (default 20 ms, above the interpreter's 5-ms switch interval with a few threads waiting,
    so a busy event loop alone does not count)."""

    def __init__(self, slack_s: float = 0.02) -> None:
        self.held_s = 0.0
        self.longest_s = 0.0
        self._slack_s = slack_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="process-stalls", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.is_set():
            asked = time.perf_counter() + TICK_S
            time.sleep(TICK_S)
            late = time.perf_counter() - asked
            if late > self._slack_s:
                self.held_s += late
                self.longest_s = max(self.longest_s, late)

    def stop(self) -> float:
        """Stops the meter; the seconds the whole process was held up."""
        self._stop.set()
        self._thread.join(timeout=1.0)
        return self.held_s
