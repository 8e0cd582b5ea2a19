"""One worker, assembled and run: the composition root that ``python -m services.worker`` and
the tests share.

:class:`WorkerServer` takes a validated :class:`WorkerConfig` and an engine (which it owns from
then on, unless told otherwise) and runs them in this order, after grpc's
``async_greeter_server_with_graceful_shutdown`` example:

start
    bind the port (a taken one is a :class:`~services.common.startup.StartupError`), start
    gRPC with health NOT_SERVING and load reports saying LOADING — routers learn of the worker
    at once and send it nothing — then load the engine in the background; once it is READY,
    push a load report and turn health SERVING.
stop
    health NOT_SERVING, drain (no new requests; in-flight ones get ``drain_grace_s`` to
    finish, the rest are aborted in the engine), health shut down (every watcher sees
    NOT_SERVING), the long-lived calls ended with OK (each WatchLoad stream's last report
    says draining; each GenerateMux call writes its streams' hand-offs and ends), then
    ``server.stop(grace)`` and the engine is shut down. A stop while the engine is still
    loading cancels the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import grpc

from meridian.v1 import worker_pb2_grpc
from services.common.grpc_tls import GrpcTls
from services.common.grpcutil import Health, new_server
from services.common.logs import event
from services.common.startup import bind_grpc
from services.common.telemetry import Telemetry
from services.worker.engine import Engine, ExposesMetrics, Instrumented
from services.worker.observability import WorkerTelemetry
from services.worker.service import EARLY_REPORT_LOAD, MAX_LOAD_WATCHERS, WorkerService

log = logging.getLogger("meridian.worker")

HEALTH_SERVICE = "meridian.v1.Worker"
#: How long ``stop`` waits for the long-lived calls to end (they end at once unless a client
#: stopped reading), and again for the handlers ``server.stop`` cancelled to finish.
STREAMS_CLOSE_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    worker_id: str
    region: str
    host: str = "127.0.0.1"
    port: int = 0
    report_interval_s: float = 0.1
    early_report_load: float = EARLY_REPORT_LOAD
    drain_grace_s: float = 10.0
    #: WatchLoad streams open at once at most (routers × replicas, with room to spare).
    max_load_watchers: int = MAX_LOAD_WATCHERS
    #: How long ``server.stop`` lets RPCs still open after the drain finish.
    stop_grace_s: float = 1.0
    #: Mutual TLS for the gRPC API (callers must present a certificate the CA signed).
    tls: GrpcTls | None = None

    def __post_init__(self) -> None:
        if not self.worker_id or not self.region:
            raise ValueError("worker_id and region must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be 0..65535")
        if not self.report_interval_s > 0:
            raise ValueError("report_interval_s must be > 0")
        if not 0.0 <= self.early_report_load <= 1.0:
            raise ValueError("early_report_load must be within [0, 1]")
        if self.max_load_watchers < 1:
            raise ValueError("max_load_watchers must be >= 1")
        if not self.drain_grace_s > 0 or self.stop_grace_s < 0:
            raise ValueError("drain_grace_s must be > 0 and stop_grace_s >= 0")


class WorkerServer:
    """A worker's gRPC server around one engine; see the module docstring for the order."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        engine: Engine,
        telemetry: Telemetry | None = None,
        owns_engine: bool = True,
    ) -> None:
        """``owns_engine=False`` serves an engine someone else started and will shut down
        (the vLLM test suite shares one engine across tests): it is neither loaded nor shut
        down here, and must already be READY."""
        self.config = config
        self.engine = engine
        self._owns_engine = owns_engine
        if telemetry is not None and isinstance(engine, Instrumented):
            engine.instrument(tracer=telemetry.tracer, meter=telemetry.meter)
        if telemetry is not None and isinstance(engine, ExposesMetrics):
            for collector in engine.prometheus_collectors():
                telemetry.registry.register(collector)
        self.service = WorkerService(
            engine=engine,
            worker_id=config.worker_id,
            region=config.region,
            report_interval_s=config.report_interval_s,
            early_report_load=config.early_report_load,
            max_load_watchers=config.max_load_watchers,
            telemetry=WorkerTelemetry(
                tracer=telemetry.tracer,
                meter=telemetry.meter,
                worker_id=config.worker_id,
                region=config.region,
                load=engine.load,
            )
            if telemetry is not None
            else None,
        )
        self.health = Health([HEALTH_SERVICE])
        self._server: grpc.aio.Server | None = None
        self._loading: asyncio.Task[None] | None = None
        self.port = 0
        self.aborted_at_stop = 0

    @property
    def address(self) -> str:
        host = self.config.host
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    async def start(self) -> int:
        """Listen (health NOT_SERVING) and start loading the engine; returns the port."""
        server = new_server()
        worker_pb2_grpc.add_WorkerServicer_to_server(self.service, server)
        self.health.add_to(server)
        self.port = bind_grpc(
            server, self.config.host, self.config.port, "the worker's gRPC API", self.config.tls
        )
        await server.start()
        self._server = server
        await self.health.set_serving(False)
        event(
            log,
            "worker.listening",
            port=self.port,
            engine=self.engine.name,
            region=self.config.region,
            mutual_tls=self.config.tls is not None,
        )
        self._loading = asyncio.get_running_loop().create_task(self._load())
        return self.port

    async def _load(self) -> None:
        if self._owns_engine:
            await self.engine.start()
        self.service.notify_state_change()
        await self.health.set_serving(True)
        event(log, "worker.ready", models=[m.name for m in self.engine.models()])

    async def wait_loaded(self) -> None:
        """Until the engine is READY and health SERVING; raises what made the load fail."""
        assert self._loading is not None, "start() first"
        await asyncio.shield(self._loading)

    async def wait_loaded_or(self, stop: asyncio.Event) -> None:
        """Until the engine is loaded or ``stop`` is set, whichever comes first. A failed load
        is logged and reported (load reports say FAILED, with the reason), not raised: the
        worker stays up so that routers and operators see why."""
        assert self._loading is not None, "start() first"
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({self._loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if self._loading.done() and not self._loading.cancelled():
            err = self._loading.exception()
            if err is not None:
                event(log, "worker.engine_failed", level=logging.ERROR, error=repr(err))
                self.service.notify_state_change()

    async def kill(self) -> None:
        """Stop at once, as a killed process looks from outside: every stream and connection
        is cut with no drain and no NOT_SERVING first. The engine is then shut down, so
        nothing keeps generating in this process. For fault drills and tests; ``stop`` is
        the graceful way."""
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        if self._owns_engine:
            await self.engine.shutdown()

    async def stop(self) -> int:
        """Drain, then stop serving and shut the engine down; returns how many requests the
        drain had to abort."""
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()  # stopped while the model was still loading
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loading
        await self.health.set_serving(False)
        aborted = await self.service.drain(self.config.drain_grace_s)
        await self.health.shutdown()
        # The long-lived calls (load streams, GenerateMux) end with OK before the server
        # stops, rather than being cut by it mid-wait.
        await self.service.close_streams(STREAMS_CLOSE_S)
        if self._server is not None:
            await self._server.stop(grace=self.config.stop_grace_s)
            self._server = None
        # Whatever the stop still had to cancel finishes before the engine (and then the
        # event loop) goes away: a handler cut short by a closing loop is an error log line.
        await self.service.settle(STREAMS_CLOSE_S)
        if self._owns_engine:
            await self.engine.shutdown()
        self.aborted_at_stop = aborted
        event(log, "worker.stopped", aborted=aborted)
        return aborted
