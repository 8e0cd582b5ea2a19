"""Real services in the test's own event loop: gRPC servers and the aiohttp edge listening on
free ports on 127.0.0.1, talking over real sockets. Cheaper than processes on a 2-core
machine; the e2e tests start real processes instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.grpc_tls import GrpcTls
from services.common.telemetry import Telemetry
from services.edge.app import EdgeDeps
from services.edge.counters import EdgeCounters
from services.edge.redisconn import RedisClient
from services.edge.server import EdgeConfig, EdgeServer, connect_redis
from services.edge.stages.validate import RequestLimits
from services.edge.tenancy.apikeys import KeyHasher
from services.edge.tenancy.directory import Directory
from services.edge.tenancy.tenants import Tenant
from services.edge.upstream.failover import FailoverPolicy
from services.edge.upstream.router_client import RouterClient
from services.router.debug import DebugConfig, DebugEndpoint
from services.router.discovery import Discovery, DiscoveryConfig
from services.router.discovery.dns import DnsTarget, Resolver
from services.router.fleet import Fleet, FleetConfig
from services.router.scheduling.profile import load_profile
from services.router.server import RouterConfig, RouterServer
from services.router.service import RouterService, Scheduler
from services.router.watcher import WatchConfig
from services.worker.engine import Engine
from services.worker.server import WorkerConfig, WorkerServer
from services.worker.service import WorkerService
from tests.support.builders import edge_config

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PROFILE = REPO / "deploy/router/profiles/default.yaml"


@dataclass
class RunningWorker:
    """A :class:`WorkerServer` (the production composition root) in this event loop."""

    server: WorkerServer
    worker_id: str
    region: str

    @property
    def engine(self) -> Engine:
        return self.server.engine

    @property
    def service(self) -> WorkerService:
        return self.server.service

    @property
    def address(self) -> str:
        return self.server.address

    async def stop(self) -> None:
        """Shut down as ``python -m services.worker`` does on SIGTERM (drain first)."""
        await self.server.stop()

    async def die(self) -> None:
        """Vanish as a killed process does: the gRPC server closes every stream at once,
        with no drain and no NOT_SERVING first (the engine is shut down afterwards, so no
        generation is left running in this process)."""
        await self.server.kill()


async def start_worker(
    engine: Engine,
    *,
    worker_id: str,
    region: str,
    report_interval_s: float = 0.05,
    host: str = "127.0.0.1",
    port: int = 0,
    drain_grace_s: float = 0.5,
    tls: GrpcTls | None = None,
) -> RunningWorker:
    """A worker listening on ``host:port`` (any loopback address; port 0 picks a free one),
    loaded and SERVING when this returns."""
    server = WorkerServer(
        config=WorkerConfig(
            worker_id=worker_id,
            region=region,
            host=host,
            port=port,
            report_interval_s=report_interval_s,
            drain_grace_s=drain_grace_s,
            stop_grace_s=0.0,
            tls=tls,
        ),
        engine=engine,
    )
    await server.start()
    await server.wait_loaded()
    return RunningWorker(server, worker_id, region)


@dataclass
class RunningRouter:
    """A :class:`RouterServer` (the production composition root) in this event loop."""

    server: RouterServer

    @property
    def fleet(self) -> Fleet:
        return self.server.fleet

    @property
    def discovery(self) -> Discovery:
        return self.server.discovery

    @property
    def service(self) -> RouterService:
        return self.server.service

    @property
    def debug(self) -> DebugEndpoint | None:
        return self.server.debug

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def debug_url(self) -> str:
        assert self.debug is not None, "started without debug="
        return f"http://127.0.0.1:{self.debug.port}"

    async def stop(self) -> None:
        await self.server.stop()

    async def wait_healthy(self, n: int, timeout_s: float = 10.0) -> None:
        """Until ``n`` workers are healthy in the router's fleet."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            healthy = [s for s in self.fleet.snapshots(SYSTEM_CLOCK.monotonic()) if s.healthy]
            if len(healthy) >= n and all(s.rtt_ms is not None for s in healthy):
                return
            if loop.time() > deadline:
                raise TimeoutError(f"only {len(healthy)} of {n} workers healthy")
            await asyncio.sleep(0.02)


async def start_router(
    worker_addresses: Sequence[str],
    *,
    scheduler: Scheduler | None = None,
    stale_after_s: float = 0.5,
    report_interval_ms: int = 50,
    site: str = "test",
    dns: Sequence[DnsTarget] = (),
    dns_interval_s: float = 5.0,
    resolver: Resolver | None = None,
    announce_dir: Path | None = None,
    announce_interval_s: float = 1.0,
    probe_interval_s: float = 0.25,
    debug: DebugConfig | None = None,
    listen: str = "127.0.0.1:0",
    tls: GrpcTls | None = None,
) -> RunningRouter:
    """A router in this event loop. Workers come from ``worker_addresses`` (static), ``dns``
    names (re-resolved every ``dns_interval_s``, through ``resolver`` if given) and
    ``announce_dir``; ``debug`` also starts the debug endpoint."""
    host, _, port = listen.rpartition(":")
    server = RouterServer(
        config=RouterConfig(
            site=site,
            host=host,
            port=int(port),
            fleet=FleetConfig(stale_after_s=stale_after_s),
            discovery=DiscoveryConfig(
                static=tuple(worker_addresses),
                dns=tuple(dns),
                dns_interval_s=dns_interval_s,
                announce_dir=announce_dir,
                announce_interval_s=announce_interval_s,
                watch=WatchConfig(
                    report_interval_ms=report_interval_ms,
                    probe_interval_s=probe_interval_s,
                    tls=tls,
                ),
            ),
            debug=debug,
            stop_grace_s=0.0,
            tls=tls,
        ),
        scheduler=scheduler or load_profile(DEFAULT_PROFILE),
        resolver=resolver,
    )
    await server.start()
    return RunningRouter(server)


#: The in-process edges' key pepper (tests only); their admin token is ``TEST_ADMIN_TOKEN``.
TEST_PEPPER = b"meridian-test-pepper-not-secret"


@dataclass
class RunningEdge:
    server: EdgeServer
    url: str
    deps: EdgeDeps
    redis: RedisClient

    @property
    def directory(self) -> Directory:
        return self.server.directory

    @property
    def counters(self) -> EdgeCounters:
        return self.server.counters

    @property
    def admin_url(self) -> str:
        assert self.server.admin_url is not None
        return self.server.admin_url

    async def new_key(self, tenant: str = "t1", **tenant_fields: Any) -> str:
        """A key of ``tenant``, which is created (unlimited unless told) if it does not exist."""
        await self.directory.ensure_tenant(Tenant(tenant_id=tenant, **tenant_fields))
        raw, _ = await self.directory.create_key(tenant)
        return raw

    async def stop(self) -> None:
        await self.server.stop()


async def start_edge(
    *,
    redis_url: str,
    router_address: str,
    policy: FailoverPolicy | None = None,
    keepalive_after_s: float = 3.0,
    max_body_bytes: int = 1024 * 1024,
    config: EdgeConfig | None = None,
    clock: Clock = SYSTEM_CLOCK,
    pepper: bytes = TEST_PEPPER,
    telemetry: Telemetry | None = None,
) -> RunningEdge:
    """An edge on a free port of 127.0.0.1 (plain HTTP, admin API on another free port)
    unless ``config`` says otherwise; ``policy``, ``keepalive_after_s`` and
    ``max_body_bytes`` apply only when no ``config`` is given."""
    if config is None:
        config = edge_config(
            failover=policy or FailoverPolicy(first_token_timeout_s=10.0),
            request_limits=RequestLimits(max_body_bytes=max_body_bytes),
            keepalive_after_s=keepalive_after_s,
        )
    redis = connect_redis(redis_url)
    server = EdgeServer(
        config=config,
        redis=redis,
        router=RouterClient(router_address, tls=config.grpc_tls),
        hasher=KeyHasher(pepper),
        clock=clock,
        telemetry=telemetry,
    )
    await server.start()
    return RunningEdge(server, server.url, server.deps, redis)


async def stop_all(*things: RunningWorker | RunningRouter | RunningEdge) -> None:
    for thing in things:
        await thing.stop()
