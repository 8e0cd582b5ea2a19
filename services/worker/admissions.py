"""Which router decisions this worker has admitted, for its load reports.

A router counts a request as *in flight* from its decision until the worker's own counts
include it; guessing that moment from timing double-counts requests (or forgets them) when
requests are short or reports far apart. Instead the worker echoes the decision ids it admitted
since each report stream's previous report, and the router drops exactly those.

Bounded: the log keeps the newest ``max_entries`` ids; a report carries at most
``max_per_report`` (the newest); anything older falls back to the router's time-based rule.
"""

from __future__ import annotations

import collections
import itertools


class AdmissionLog:
    def __init__(self, *, max_entries: int = 8192, max_per_report: int = 2048) -> None:
        if max_entries < 1 or max_per_report < 1:
            raise ValueError("max_entries and max_per_report must be >= 1")
        self._entries: collections.deque[tuple[int, str]] = collections.deque(maxlen=max_entries)
        self._seq = itertools.count(1)
        self._max_per_report = max_per_report
        self.last_seq = 0

    def admitted(self, decision_id: str) -> None:
        if decision_id:
            self.last_seq = next(self._seq)
            self._entries.append((self.last_seq, decision_id))

    def since(self, seq: int) -> list[str]:
        """Ids admitted after ``seq`` (a stream's cursor), newest ``max_per_report`` of them."""
        out: list[str] = []
        for s, decision_id in reversed(self._entries):
            if s <= seq or len(out) >= self._max_per_report:
                break
            out.append(decision_id)
        out.reverse()
        return out
