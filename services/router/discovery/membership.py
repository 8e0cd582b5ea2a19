"""Which worker addresses this router watches: the union of what every discovery source says.

Each source (the static list, one DNS name, the announcement directory) owns a named set of
addresses and replaces it whole whenever it learns something (``update``). An address is
watched while at least one source lists it: one :class:`WorkerWatcher` per address, started
when the first source names it and stopped when the last one drops it (the fleet forgets
the worker with it). Two sources naming the same address share one watcher; two addresses
leading to the same worker are folded by the fleet (see ``fleet.py``, aliases).

Health is not membership: a listed worker that dies is marked down by its watcher within a
second and stays listed, so it is back in the view as soon as it answers again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from services.common.clock import Clock
from services.common.logs import event
from services.router.fleet import Fleet
from services.router.watcher import WatchConfig, WorkerWatcher

log = logging.getLogger("meridian.router.discovery")


class Membership:
    def __init__(self, *, fleet: Fleet, clock: Clock, watch: WatchConfig | None = None) -> None:
        self._fleet = fleet
        self._clock = clock
        self._watch = watch or WatchConfig()
        self._sources: dict[str, frozenset[str]] = {}
        self._watchers: dict[str, WorkerWatcher] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._closed = False

    def update(self, source: str, addresses: Iterable[str]) -> None:
        """Replace what ``source`` lists; start and stop watchers for the difference.
        Must be called from the event loop."""
        if self._closed:
            return
        wanted = frozenset(addresses)
        before = self._sources.get(source, frozenset())
        if wanted == before:
            return
        if wanted:
            self._sources[source] = wanted
        else:
            self._sources.pop(source, None)
        current = self.addresses()
        for address in sorted(wanted - before):
            if address not in self._watchers:
                watcher = WorkerWatcher(
                    address=address, fleet=self._fleet, clock=self._clock, config=self._watch
                )
                self._watchers[address] = watcher
                watcher.start()
                event(log, "discovery.added", address=address, source=source)
        for address in sorted(before - wanted):
            if address not in current and address in self._watchers:
                task = asyncio.create_task(self._watchers.pop(address).stop())
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
                event(log, "discovery.removed", address=address, source=source)

    def addresses(self) -> frozenset[str]:
        """Every address some source lists now."""
        return frozenset().union(*self._sources.values())

    def sources(self) -> dict[str, frozenset[str]]:
        """Source name → the addresses it lists (for the debug view)."""
        return dict(self._sources)

    async def stop(self) -> None:
        self._closed = True
        watchers, self._watchers = list(self._watchers.values()), {}
        self._sources.clear()
        await asyncio.gather(*(w.stop() for w in watchers), *self._stopping)
