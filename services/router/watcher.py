"""One task per worker address: describe it, follow its load stream, and probe its RTT.

The watcher is the only place the router does network I/O towards workers. It feeds the
:class:`~services.router.fleet.Fleet` and reconnects with a short backoff, so a
restarted worker is back in the view within about a second of listening again.

RTT is measured by this router (the Probe RPC, timed here) through whatever network lies
between this site and the worker — in the local stack, the delay proxy in front of each region.
Every router replica runs its own watchers: each worker serves one load stream and one probe
loop per replica (see docs/router.md for what that costs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass

import grpc

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common.clock import Clock
from services.common.grpc_tls import GrpcTls
from services.common.grpcutil import channel_to
from services.common.logs import event
from services.router.fleet import Fleet

log = logging.getLogger("meridian.router.watcher")


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchConfig:
    """How a router follows each worker.

    ``report_interval_ms``: the load-report period asked of the worker (10..60000).
    ``probe_interval_s``: time between RTT probes; ``probe_timeout_s``: a probe unanswered
    this long counts as lost. ``describe_timeout_s``: limit on the first call of a
    connection. ``backoff_min_s``/``backoff_max_s``: reconnect delay, doubling per failure.
    """

    report_interval_ms: int = 100
    probe_interval_s: float = 0.25
    probe_timeout_s: float = 1.0
    describe_timeout_s: float = 2.0
    backoff_min_s: float = 0.2
    backoff_max_s: float = 2.0
    #: Mutual TLS to the workers (None: plaintext).
    tls: GrpcTls | None = None

    def __post_init__(self) -> None:
        if not 10 <= self.report_interval_ms <= 60_000:
            raise ValueError("report_interval_ms must be in 10..60000")
        for name in ("probe_interval_s", "probe_timeout_s", "describe_timeout_s", "backoff_min_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0")
        if not self.backoff_max_s >= self.backoff_min_s:
            raise ValueError("backoff_max_s must be >= backoff_min_s")


class WorkerWatcher:
    def __init__(
        self,
        *,
        address: str,
        fleet: Fleet,
        clock: Clock,
        config: WatchConfig | None = None,
    ) -> None:
        self.address = address
        self._fleet = fleet
        self._clock = clock
        self._config = config or WatchConfig()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._fleet.add(self.address)
        self._task = asyncio.create_task(self._run(), name=f"watch {self.address}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fleet.remove(self.address)

    async def _run(self) -> None:
        cfg = self._config
        backoff = cfg.backoff_min_s
        failures = 0  # consecutive connection attempts that never got a load report
        while True:
            channel = channel_to(self.address, cfg.tls)
            reported = False
            try:
                stub = worker_pb2_grpc.WorkerStub(channel)
                info = await stub.Describe(
                    worker_pb2.DescribeRequest(), timeout=cfg.describe_timeout_s
                )
                self._fleet.on_describe(self.address, info)
                event(log, "worker.connected", address=self.address, worker_id=info.worker_id)
                reported, reason = await self._follow(stub)
            except grpc.aio.AioRpcError as err:
                reason = _reason(err)
            finally:
                await channel.close(grace=None)
            self._fleet.on_disconnect(self.address, reason)
            if reported:
                backoff, failures = cfg.backoff_min_s, 0
            failures += not reported
            # One warning when a worker goes away or first fails; retries of an address that
            # keeps failing are logged at debug level (a dead address must not flood the log).
            event(
                log,
                "worker.disconnected" if reported else "worker.unreachable",
                level=logging.WARNING if failures <= 1 else logging.DEBUG,
                address=self.address,
                reason=reason,
                attempts=failures,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, cfg.backoff_max_s)

    async def _follow(self, stub: worker_pb2_grpc.WorkerStub) -> tuple[bool, str]:
        """Follow the load stream until it ends: whether any report arrived, and why it
        ended."""
        prober = asyncio.create_task(self._probe_loop(stub))
        reported = False
        reason = "load stream ended"
        try:
            call = stub.WatchLoad(
                worker_pb2.WatchLoadRequest(interval_ms=self._config.report_interval_ms)
            )
            async for report in call:
                reported = True
                self._fleet.on_report(self.address, report, self._clock.monotonic())
        except grpc.aio.AioRpcError as err:
            reason = _reason(err)
        finally:
            prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prober
        return reported, reason

    async def _probe_loop(self, stub: worker_pb2_grpc.WorkerStub) -> None:
        cfg = self._config
        while True:
            started = time.perf_counter()
            try:
                await stub.Probe(
                    worker_pb2.ProbeRequest(sent_unix_ns=time.time_ns()),
                    timeout=cfg.probe_timeout_s,
                )
                self._fleet.on_probe(self.address, (time.perf_counter() - started) * 1000)
            except grpc.aio.AioRpcError:
                self._fleet.on_probe(self.address, None)
            await asyncio.sleep(cfg.probe_interval_s)


def _reason(err: grpc.aio.AioRpcError) -> str:
    return f"{err.code().name}: {err.details()}"
