"""What the router tells an operator's console: a live feed of its view and its decisions
(``WatchFleet``), and the full explanation of one request's decisions (``ExplainRequest``).

Both read what the router keeps anyway — the fleet's snapshots and the
:class:`~services.router.journal.DecisionJournal` — and add nothing to ``Route``: a watcher
remembers the journal's sequence number it last saw and, every ``decision_interval_ms``, asks
for what is newer (:meth:`DecisionJournal.since`). A watcher slower than the journal (more
than ``capacity`` decisions between two of its reads, or a consumer that does not read its
stream) is told how many decisions it missed instead of holding anything back; gRPC's flow
control stops this loop, not the router, while the consumer is not reading.

Watchers are bounded (``max_watchers``; one per edge is the normal case): one more is refused
with RESOURCE_EXHAUSTED. Each update carries at most ``max_decisions_per_update`` decisions
(the rest are counted as skipped), so one message stays small whatever the rate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from meridian.v1 import router_pb2
from services.router.journal import DecisionJournal, JournalEntry
from services.router.observability import deciding_signal
from services.router.scheduling.types import Priority

_PRIORITY_TO_PB = {
    Priority.LOW: router_pb2.PRIORITY_LOW,
    Priority.STANDARD: router_pb2.PRIORITY_STANDARD,
    Priority.HIGH: router_pb2.PRIORITY_HIGH,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedConfig:
    max_watchers: int = 8
    max_decisions_per_update: int = 256
    min_view_interval_s: float = 0.1
    min_decision_interval_s: float = 0.05
    default_view_interval_s: float = 1.0
    default_decision_interval_s: float = 0.25

    def __post_init__(self) -> None:
        if self.max_watchers < 1 or self.max_decisions_per_update < 1:
            raise ValueError("max_watchers and max_decisions_per_update must be >= 1")


def summarise(entry: JournalEntry) -> router_pb2.DecisionSummary:
    """One decision as the console's map draws it."""
    decision, query = entry.decision, entry.query
    out = router_pb2.DecisionSummary(
        decision_id=entry.decision_id,
        at_unix_ms=int(entry.at_unix * 1000),
        model=query.model,
        priority=_PRIORITY_TO_PB[query.priority],
        ranked=len(decision.ranked),
        filtered=len(decision.rejected),
        reroute=bool(query.exclude_worker_ids),
    )
    if not decision.ranked:
        out.empty_reason = decision.empty_reason.value if decision.empty_reason else "unavailable"
        return out
    win = decision.ranked[0]
    out.worker_id, out.region, out.score = win.worker.worker_id, win.worker.region, win.score
    out.signal = deciding_signal(decision)
    if len(decision.ranked) > 1:
        run = decision.ranked[1]
        out.runner_up_worker_id, out.runner_up_region = run.worker.worker_id, run.worker.region
        out.runner_up_score = run.score
    return out


class WatcherLimit(Exception):
    """Every watcher slot is taken."""


class FleetFeed:
    """The ``WatchFleet`` loop for each watcher, over the router's view and journal."""

    def __init__(
        self,
        *,
        journal: DecisionJournal,
        view: Callable[[], router_pb2.RouterView],
        config: FeedConfig | None = None,
    ) -> None:
        self._journal = journal
        self._view = view
        self.config = config or FeedConfig()
        self.watchers = 0
        self.updates_sent = 0
        self.decisions_skipped = 0

    def intervals(self, request: router_pb2.WatchFleetRequest) -> tuple[float, float]:
        """(view, decision) intervals in seconds, defaulted and clamped to the minimums."""
        c = self.config
        view_s = request.view_interval_ms / 1000 or c.default_view_interval_s
        decision_s = request.decision_interval_ms / 1000 or c.default_decision_interval_s
        return max(view_s, c.min_view_interval_s), max(decision_s, c.min_decision_interval_s)

    def acquire(self) -> None:
        if self.watchers >= self.config.max_watchers:
            raise WatcherLimit(f"at most {self.config.max_watchers} fleet watchers")
        self.watchers += 1

    def release(self) -> None:
        self.watchers -= 1

    def start_seq(self) -> int:
        return self._journal.recorded

    def update(self, seen: int, *, with_view: bool) -> tuple[router_pb2.FleetUpdate, int]:
        """The next update for a watcher that has seen the journal up to ``seen``, and the
        sequence number it has seen after this one."""
        entries, skipped = self._journal.since(seen)
        limit = self.config.max_decisions_per_update
        if len(entries) > limit:
            skipped += len(entries) - limit
            entries = entries[-limit:]
        out = router_pb2.FleetUpdate(decisions_skipped=skipped)
        if with_view:
            out.view.CopyFrom(self._view())
        out.decisions.extend(summarise(e) for e in entries)
        if entries:
            newest = entries[-1]
            out.latest_filtered_at_unix_ms = int(newest.at_unix * 1000)
            for r in newest.decision.rejected:
                out.latest_filtered.add(
                    worker_id=r.worker_id, region=r.region, filter=r.filter, reason=r.reason
                )
        self.decisions_skipped += skipped
        return out, self._journal.recorded

    async def stream(
        self, request: router_pb2.WatchFleetRequest
    ) -> AsyncIterator[router_pb2.FleetUpdate]:
        """Updates for one watcher until it goes away: the view at once and every view
        interval, decisions every decision interval (an update with nothing new is not sent).
        The caller holds a watcher slot (:meth:`acquire`)."""
        view_s, decision_s = self.intervals(request)
        seen = self.start_seq()
        next_view = 0.0
        while True:
            now = time.monotonic()
            with_view = now >= next_view
            if with_view:
                next_view = now + view_s
            update, seen = self.update(seen, with_view=with_view)
            if with_view or update.decisions or update.decisions_skipped:
                self.updates_sent += 1
                yield update
            await asyncio.sleep(min(decision_s, max(0.0, next_view - time.monotonic())))
