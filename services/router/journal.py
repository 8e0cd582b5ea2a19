"""What the router remembers about its own recent decisions, for operators (the debug
endpoint): the last N decisions whole, per-plugin time per decision, and running counts.

Recording is O(1) per decision (a reference appended to a bounded deque, a counter bumped):
decisions and their timing maps are immutable, so nothing is copied or formatted until
someone asks. Percentiles are computed on read, over the last ``window`` decisions.

Nothing here is shared between router replicas: each one explains its own decisions.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping
from dataclasses import dataclass

from services.router.scheduling.types import Decision, RouteQuery


@dataclass(frozen=True, slots=True)
class JournalEntry:
    at_unix: float
    decision_id: str  # "" for an empty decision (nothing was assigned)
    query: RouteQuery
    decision: Decision
    decision_us: float


class DecisionJournal:
    """The last ``capacity`` decisions (newest last), and counts since start."""

    def __init__(self, capacity: int = 256) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._entries: collections.deque[JournalEntry] = collections.deque(maxlen=capacity)
        #: Decisions recorded since start: the sequence number of the newest entry. Watchers
        #: (services/router/feed.py) remember the last one they saw and ask for what is newer.
        self.recorded = 0
        self.routed_by_region: collections.Counter[str] = collections.Counter()
        # (reason, priority name) → count: which tiers were shed, and why
        self.empty_by_reason: collections.Counter[tuple[str, str]] = collections.Counter()

    @property
    def capacity(self) -> int:
        return self._entries.maxlen or 0

    def record(self, entry: JournalEntry) -> None:
        self._entries.append(entry)
        self.recorded += 1
        decision = entry.decision
        if decision.ranked:
            self.routed_by_region[decision.ranked[0].worker.region] += 1
        else:
            reason = decision.empty_reason.value if decision.empty_reason else "unavailable"
            self.empty_by_reason[(reason, entry.query.priority.name.lower())] += 1

    def recent(self, n: int) -> list[JournalEntry]:
        """Up to ``n`` most recent decisions, newest first."""
        if n <= 0:
            return []
        entries = self._entries
        return [entries[-i] for i in range(1, min(n, len(entries)) + 1)]

    def since(self, seen: int) -> tuple[list[JournalEntry], int]:
        """Entries recorded after sequence number ``seen``, oldest first, and how many of
        those had already left the journal (a watcher that fell behind)."""
        newer = self.recorded - seen
        if newer <= 0:
            return [], 0
        kept = min(newer, len(self._entries))
        entries = self._entries
        return [entries[-i] for i in range(kept, 0, -1)], newer - kept

    def for_request(self, request_id: str) -> list[JournalEntry]:
        """Every decision still kept for ``request_id``, oldest first. A scan: this is asked
        when a person clicks, never on the Route path."""
        return [e for e in self._entries if e.query.request_id == request_id]


@dataclass(frozen=True, slots=True)
class TimingSummary:
    """Microseconds one plugin (or ``framework``/``total``) took per decision."""

    decisions: int
    mean_us: float
    p50_us: float
    p99_us: float
    max_us: float


class PluginTimings:
    """Per-plugin time per decision over the last ``window`` decisions (the framework's
    ``Decision.plugin_timings_us``), so the router can publish its own overhead."""

    def __init__(self, window: int = 2048) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self._window: collections.deque[Mapping[str, float]] = collections.deque(maxlen=window)
        self.decisions = 0

    def record(self, timings_us: Mapping[str, float]) -> None:
        self._window.append(timings_us)
        self.decisions += 1

    def summary(self) -> dict[str, TimingSummary]:
        columns: dict[str, list[float]] = {}
        for timings in self._window:
            for name, us in timings.items():
                columns.setdefault(name, []).append(us)
        return {name: _summarise(values) for name, values in sorted(columns.items())}


def _summarise(values: list[float]) -> TimingSummary:
    values.sort()
    n = len(values)
    return TimingSummary(
        decisions=n,
        mean_us=math.fsum(values) / n,
        p50_us=_quantile(values, 0.50),
        p99_us=_quantile(values, 0.99),
        max_us=values[-1],
    )


def _quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile of a sorted, non-empty list."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
