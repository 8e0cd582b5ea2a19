"""A sum over a sliding window of clock time, for rates read on every load report.

``add(now, value)`` records a sample; ``total(now)`` sums the samples newer than
``now - window_s``. Samples are appended in time order, so expiry pops from the left and both
operations are amortised O(1). Time is passed in, so tests drive it with a manual clock.
"""

from __future__ import annotations

from collections import deque


class WindowedSum:
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
        horizon = now - self.window_s
        while self._samples and self._samples[0][0] <= horizon:
            self._total -= self._samples.popleft()[1]
        if not self._samples:
            self._total = 0.0  # no float residue once the window is empty
        return self._total
