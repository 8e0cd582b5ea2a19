"""A sum over a sliding window of clock time, for rates read on every load report.

``add(now, value)`` records a sample; ``total(now)`` sums the samples newer than
``now - window_s``. Samples are appended in time order, so expiry pops from the left and both
operations are amortised O(1). Time is passed in, so tests drive it with a manual clock.
"""

from __future__ import annotations

from collections import deque


class WindowedSum:
    # Slots: the planet simulator keeps four per simulated GPU and reads them on every report.
    __slots__ = ("_samples", "_total", "window_s")

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()
        self._total = 0.0

    def add(self, now: float, value: float) -> None:
        self._samples.append((now, value))
        self._total += value

    def total(self, now: float) -> float:
        samples = self._samples
        if not samples:
            self._total = 0.0  # no float residue once the window is empty
            return 0.0
        horizon = now - self.window_s
        if samples[0][0] > horizon:  # nothing expired (most reads)
            return self._total
        total = self._total
        while samples and samples[0][0] <= horizon:
            total -= samples.popleft()[1]
        self._total = total if samples else 0.0
        return self._total
