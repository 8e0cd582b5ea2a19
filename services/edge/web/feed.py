"""The console's live feed: one ``WatchFleet`` stream from this edge's router, fanned out to
every open console, each through a bounded mailbox.

    router ── WatchFleet (one stream, only while a console is open) ──▶ FleetHub
        └─ per update: view JSON once, decisions, events (state diffs, rejections, counters)
             ├─▶ Mailbox (console 1) ──▶ SSE writer (routes.py)
             └─▶ Mailbox (console 2) ──▶ …

Back-pressure: the hub never waits for a browser. A mailbox keeps the *latest* view only (an
unsent older view is replaced and counted as coalesced), and at most ``max_pending_decisions``
decisions and ``max_pending_events`` events; beyond that the oldest are dropped and counted,
and the counts travel to the page with the next write (``event: stats``). The SSE writer sends
whatever is in the mailbox in one go, so a slow reader receives fewer, fuller messages rather
than an ever longer queue; a reader whose socket stays full past the edge's write timeout is
cut off.

Bounds: ``max_console_streams`` mailboxes in all and ``max_console_streams_per_session`` per
session; the upstream stream starts with the first mailbox and stops with the last, so an edge
with no console open does no work for it. While the router is unreachable the hub retries with
backoff and tells every page (``event: status``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from meridian.v1 import router_pb2
from services.common.errors import MeridianError, Overloaded
from services.common.logs import event
from services.edge.web import payloads
from services.edge.web.config import WebConfig

log = logging.getLogger("meridian.edge.console")

#: ``watch(request)`` opens the router's WatchFleet stream (RouterClient.watch_fleet).
Watch = Callable[[router_pb2.WatchFleetRequest], AsyncIterator[router_pb2.FleetUpdate]]


def sse(event_name: str, data: Any) -> bytes:
    return f"event: {event_name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class Mailbox:
    """What one console has not been sent yet (see the module docstring)."""

    def __init__(self, *, session: str, max_decisions: int, max_events: int) -> None:
        self.session = session
        self.view: bytes | None = None
        self.status: bytes | None = None
        self.decisions: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_decisions)
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_events)
        self.dropped_decisions = 0
        self.dropped_events = 0
        self.coalesced_views = 0
        self._reported = (0, 0, 0)
        self._closed = False
        self._wake = asyncio.Event()

    def put(
        self,
        *,
        view: bytes | None = None,
        decisions: list[dict[str, Any]] | None = None,
        events: list[dict[str, Any]] | None = None,
        status: bytes | None = None,
    ) -> None:
        if view is not None:
            if self.view is not None:
                self.coalesced_views += 1
            self.view = view
        if status is not None:
            self.status = status
        for item in decisions or ():
            if len(self.decisions) == self.decisions.maxlen:
                self.dropped_decisions += 1
            self.decisions.append(item)
        for item in events or ():
            if len(self.events) == self.events.maxlen:
                self.dropped_events += 1
            self.events.append(item)
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def closed(self) -> bool:
        """Closed by the hub (the edge drains): the stream ends."""
        return self._closed

    async def wait(self, timeout_s: float) -> bool:
        """Until something is waiting (True) or ``timeout_s`` passed (False)."""
        if not self._wake.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout_s)
        woke = self._wake.is_set()
        self._wake.clear()
        return woke

    def take(self) -> bytes:
        """Everything waiting, as SSE frames in one buffer (empty when nothing is)."""
        parts: list[bytes] = []
        if self.status is not None:
            parts.append(self.status)
            self.status = None
        if self.view is not None:
            parts.append(self.view)
            self.view = None
        if self.decisions:
            parts.append(sse("decisions", list(self.decisions)))
            self.decisions.clear()
        if self.events:
            parts.append(sse("events", list(self.events)))
            self.events.clear()
        counts = (self.dropped_decisions, self.dropped_events, self.coalesced_views)
        if counts != self._reported:
            self._reported = counts
            parts.append(
                sse(
                    "stats",
                    {
                        "dropped_decisions": counts[0],
                        "dropped_events": counts[1],
                        "coalesced_views": counts[2],
                    },
                )
            )
        return b"".join(parts)


class FleetHub:
    """One upstream feed for every console of this edge (see the module docstring)."""

    def __init__(
        self,
        *,
        watch: Watch,
        config: WebConfig,
        site: str,
        counters: Callable[[], dict[str, int]],
        view_interval_ms: int = 1000,
        decision_interval_ms: int = 200,
    ) -> None:
        self._watch = watch
        self._config = config
        self._site = site
        self._counters = counters
        self._request = router_pb2.WatchFleetRequest(
            view_interval_ms=view_interval_ms, decision_interval_ms=decision_interval_ms
        )
        self._boxes: list[Mailbox] = []
        self._task: asyncio.Task[None] | None = None
        self._last_view: bytes | None = None
        self._states: dict[str, str] = {}
        self._counts: dict[str, int] = {}
        self._closed = False
        self._unreachable = False
        # Totals for metrics and tests.
        self.updates = 0
        self.upstream_starts = 0
        self.upstream_failures = 0
        self.router_skipped = 0

    @property
    def open_streams(self) -> int:
        return len(self._boxes)

    def dropped(self) -> int:
        return sum(b.dropped_decisions + b.dropped_events for b in self._boxes)

    def subscribe(self, session: str) -> Mailbox:
        """A mailbox for one console stream; Overloaded (429/503) past the bounds."""
        cfg = self._config
        if self._closed:
            raise Overloaded("This edge is shutting down.", retry_after_s=5.0)
        if len(self._boxes) >= cfg.max_console_streams:
            raise Overloaded("Too many open consoles on this edge.", retry_after_s=10.0)
        if sum(b.session == session for b in self._boxes) >= cfg.max_console_streams_per_session:
            raise Overloaded(
                "Too many consoles open in this session; close one.", retry_after_s=10.0
            )
        box = Mailbox(
            session=session,
            max_decisions=cfg.max_pending_decisions,
            max_events=cfg.max_pending_events,
        )
        if self._last_view is not None:
            box.put(view=self._last_view)
        self._boxes.append(box)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return box

    def unsubscribe(self, box: Mailbox) -> None:
        with contextlib.suppress(ValueError):
            self._boxes.remove(box)
        if not self._boxes and self._task is not None:
            self._task.cancel()
            self._task = None

    def close(self) -> None:
        """Draining: every console stream ends now; none opens again."""
        self._closed = True
        for box in list(self._boxes):
            box.close()
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def aclose(self) -> None:
        task = self._task
        self.close()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _broadcast(self, **items: Any) -> None:
        for box in self._boxes:
            box.put(**items)

    async def _run(self) -> None:
        backoff = 0.5
        while self._boxes:
            self.upstream_starts += 1
            try:
                async for update in self._watch(self._request):
                    backoff = 0.5
                    self.on_update(update)
            except MeridianError as err:
                self.upstream_failures += 1
                self._unreachable = True
                event(log, "console.feed_failed", level=logging.WARNING, error=err.message)
                status = {"router": "unreachable", "detail": err.message}
                self._broadcast(status=sse("status", status))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def on_update(self, update: router_pb2.FleetUpdate) -> None:
        """One message from the router, turned into JSON once and put in every mailbox."""
        self.updates += 1
        self.router_skipped += update.decisions_skipped
        now_ms = int(time.time() * 1000)
        decisions = [payloads.decision_json(d) for d in update.decisions]
        events = payloads.rejection_events(decisions)
        view_frame = None
        if update.HasField("view"):
            view = payloads.view_json(update, self._config, self._site)
            events += payloads.state_events(self._states, view["workers"], now_ms)
            self._states = {w["id"]: w["state"] for w in view["workers"]}
            counts = self._counters()
            if self._counts:
                events += payloads.counter_events(self._counts, counts, now_ms)
            self._counts = counts
            view["router_skipped"] = self.router_skipped
            view_frame = self._last_view = sse("view", view)
        status = None
        if self._unreachable:
            self._unreachable = False
            status = sse("status", {"router": "ok"})
        self._broadcast(view=view_frame, decisions=decisions, events=events, status=status)
