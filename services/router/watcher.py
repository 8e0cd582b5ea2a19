"""One task per worker address: describe it, follow its load stream, and probe its RTT.

The watcher is the only place the router does network I/O towards workers. It feeds the
:class:`~services.router.registry.WorkerRegistry` and reconnects with a short backoff, so a
restarted worker is back in the view within about a second of listening again.

RTT is measured by this router (the Probe RPC, timed here) through whatever network lies
between this site and the worker — in the local stack, the delay proxy in front of each region.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common.clock import Clock
from services.common.grpcutil import insecure_channel
from services.common.logs import event
from services.router.registry import WorkerRegistry

log = logging.getLogger("meridian.router.watcher")


class WorkerWatcher:
    def __init__(
        self,
        *,
        address: str,
        registry: WorkerRegistry,
        clock: Clock,
        report_interval_ms: int = 100,
        probe_interval_s: float = 0.25,
        probe_timeout_s: float = 1.0,
    ) -> None:
        self.address = address
        self._registry = registry
        self._clock = clock
        self._report_interval_ms = report_interval_ms
        self._probe_interval_s = probe_interval_s
        self._probe_timeout_s = probe_timeout_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._registry.add(self.address)
        self._task = asyncio.create_task(self._run(), name=f"watch {self.address}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._registry.remove(self.address)

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            channel = insecure_channel(self.address)
            try:
                stub = worker_pb2_grpc.WorkerStub(channel)
                info = await stub.Describe(worker_pb2.DescribeRequest(), timeout=2.0)
                self._registry.on_describe(self.address, info)
                event(log, "worker.connected", address=self.address, worker_id=info.worker_id)
                backoff = 0.2
                await self._follow(stub)
                reason = "load stream ended"
            except grpc.aio.AioRpcError as err:
                reason = f"{err.code().name}: {err.details()}"
            finally:
                await channel.close(grace=None)
            self._registry.on_disconnect(self.address, reason)
            event(
                log,
                "worker.disconnected",
                level=logging.WARNING,
                address=self.address,
                reason=reason,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _follow(self, stub: worker_pb2_grpc.WorkerStub) -> None:
        prober = asyncio.create_task(self._probe_loop(stub))
        try:
            call = stub.WatchLoad(worker_pb2.WatchLoadRequest(interval_ms=self._report_interval_ms))
            async for report in call:
                self._registry.on_report(self.address, report, self._clock.monotonic())
        finally:
            prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prober

    async def _probe_loop(self, stub: worker_pb2_grpc.WorkerStub) -> None:
        while True:
            started = time.perf_counter()
            try:
                await stub.Probe(
                    worker_pb2.ProbeRequest(sent_unix_ns=time.time_ns()),
                    timeout=self._probe_timeout_s,
                )
                self._registry.on_probe(self.address, (time.perf_counter() - started) * 1000)
            except grpc.aio.AioRpcError:
                self._registry.on_probe(self.address, None)
            await asyncio.sleep(self._probe_interval_s)
