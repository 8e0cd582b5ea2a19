"""How the router finds workers. Every discovery keeps one
:class:`~services.router.watcher.WorkerWatcher` per address and adds or removes watchers as
the set of addresses changes; the registry follows.

``StaticDiscovery`` takes a fixed list (local stack, docker-compose). Other sources (DNS names
that resolve to several workers, workers announcing themselves) feed the same ``set_addresses``.
"""

from __future__ import annotations

import asyncio

from services.common.clock import Clock
from services.router.registry import WorkerRegistry
from services.router.watcher import WorkerWatcher


class StaticDiscovery:
    def __init__(
        self,
        *,
        registry: WorkerRegistry,
        clock: Clock,
        addresses: list[str],
        report_interval_ms: int = 100,
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._report_interval_ms = report_interval_ms
        self._initial = list(dict.fromkeys(addresses))
        self._watchers: dict[str, WorkerWatcher] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self.set_addresses(self._initial)

    def set_addresses(self, addresses: list[str]) -> None:
        wanted = set(addresses)
        for address in list(self._watchers):
            if address not in wanted:
                task = asyncio.create_task(self._watchers.pop(address).stop())
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
        for address in addresses:
            if address not in self._watchers:
                watcher = WorkerWatcher(
                    address=address,
                    registry=self._registry,
                    clock=self._clock,
                    report_interval_ms=self._report_interval_ms,
                )
                self._watchers[address] = watcher
                watcher.start()

    async def stop(self) -> None:
        watchers, self._watchers = list(self._watchers.values()), {}
        await asyncio.gather(*(w.stop() for w in watchers), *self._stopping)
