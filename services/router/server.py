"""One router replica, assembled and run: the composition root that ``python -m
services.router`` and the tests share.

:class:`RouterServer` takes a validated :class:`RouterConfig` and a scheduler (a loaded
profile) and builds the fleet, discovery, the gRPC service with standard health checking and,
when configured, the debug endpoint. Order, after grpc's
``async_greeter_server_with_graceful_shutdown`` example:

start
    bind every listener before anything runs (a taken port is a
    :class:`~services.common.startup.StartupError` and nothing is left listening), start gRPC,
    start discovery (watchers open load streams and probes), then health SERVING.
stop
    health shut down (NOT_SERVING for every watcher), debug endpoint closed,
    ``server.stop(grace)`` (Route calls in progress finish), discovery stopped (watchers
    cancelled, the fleet forgets its workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import grpc

from meridian.v1 import router_pb2_grpc
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.grpc_tls import GrpcTls
from services.common.grpcutil import Health, new_server
from services.common.logs import event
from services.common.loopwatch import LoopWatch
from services.common.startup import bind_grpc
from services.common.telemetry import Telemetry
from services.router.debug import DebugConfig, DebugEndpoint
from services.router.discovery import Discovery, DiscoveryConfig
from services.router.discovery.dns import Resolver
from services.router.fleet import Fleet, FleetConfig
from services.router.observability import RouterTelemetry
from services.router.service import RouterService, Scheduler

log = logging.getLogger("meridian.router")

HEALTH_SERVICE = "meridian.v1.Router"


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterConfig:
    site: str = "local"
    host: str = "127.0.0.1"
    port: int = 0
    fleet: FleetConfig = field(default_factory=FleetConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    #: None: no debug endpoint.
    debug: DebugConfig | None = None
    #: How long ``server.stop`` lets Route calls in progress finish.
    stop_grace_s: float = 1.0
    #: Mutual TLS for the gRPC API (callers must present a certificate the CA signed).
    tls: GrpcTls | None = None

    def __post_init__(self) -> None:
        if not self.site:
            raise ValueError("site must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be 0..65535")
        if self.stop_grace_s < 0:
            raise ValueError("stop_grace_s must be >= 0")


class RouterServer:
    """A router replica; see the module docstring for the start and stop order."""

    def __init__(
        self,
        *,
        config: RouterConfig,
        scheduler: Scheduler,
        clock: Clock = SYSTEM_CLOCK,
        telemetry: Telemetry | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        #: The event loop's own stalls: a report's age does not count them (see Fleet).
        self.loop_watch = LoopWatch(clock=clock.monotonic)
        self.fleet = Fleet(config.fleet, stalled_since=self.loop_watch.stalled_since)
        self._watching: asyncio.Task[None] | None = None
        self.discovery = Discovery(
            fleet=self.fleet, clock=clock, config=config.discovery, resolver=resolver
        )
        fleet = self.fleet
        self.service = RouterService(
            fleet=fleet,
            scheduler=scheduler,
            clock=clock,
            site=config.site,
            telemetry=RouterTelemetry(
                tracer=telemetry.tracer,
                meter=telemetry.meter,
                snapshots=lambda: fleet.snapshots(clock.monotonic()),
            )
            if telemetry is not None
            else None,
        )
        self.health = Health([HEALTH_SERVICE])
        self.debug: DebugEndpoint | None = None
        if config.debug is not None:
            self.debug = DebugEndpoint(
                config=config.debug, service=self.service, membership=self.discovery.membership
            )
        self._server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        host = self.config.host
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def debug_port(self) -> int | None:
        return None if self.debug is None else self.debug.port

    async def start(self) -> int:
        """Listen and start watching workers; returns the gRPC port."""
        cfg = self.config
        server = new_server()
        router_pb2_grpc.add_RouterServicer_to_server(self.service, server)
        self.health.add_to(server)
        self.port = bind_grpc(server, cfg.host, cfg.port, "the router's gRPC API", cfg.tls)
        if self.debug is not None:
            try:  # bound before gRPC starts: a taken port stops us cleanly
                await self.debug.start()
            except BaseException:
                await server.stop(None)
                raise
        await server.start()
        self._server = server
        self._watching = asyncio.get_running_loop().create_task(self.loop_watch.run())
        self.discovery.start()
        await self.health.set_serving(True)
        d = cfg.discovery
        event(
            log,
            "router.listening",
            port=self.port,
            site=cfg.site,
            profile=self.scheduler.name,
            workers=len(d.static),
            dns=[str(t) for t in d.dns],
            announce_dir=str(d.announce_dir) if d.announce_dir else None,
            debug_port=self.debug_port,
            mutual_tls=cfg.tls is not None,
        )
        return self.port

    async def stop(self) -> None:
        await self.health.shutdown()
        if self.debug is not None:
            await self.debug.stop()
        if self._server is not None:
            await self._server.stop(grace=self.config.stop_grace_s)
            self._server = None
        await self.discovery.stop()
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
            self._watching = None
        event(log, "router.stopped")
