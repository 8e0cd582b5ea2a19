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

import grpc

from meridian.v1 import router_pb2_grpc, worker_pb2_grpc
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.grpcutil import Health, new_server
from services.common.telemetry import Telemetry
from services.edge.apikeys import KeyHasher
from services.edge.app import EdgeDeps
from services.edge.counters import EdgeCounters
from services.edge.directory import Directory
from services.edge.failover import FailoverPolicy
from services.edge.redisconn import RedisClient
from services.edge.server import EdgeConfig, EdgeServer, connect_redis
from services.edge.stages import RequestLimits
from services.edge.tenants import Tenant
from services.edge.upstream import RouterClient
from services.router.debug import DebugConfig, DebugEndpoint
from services.router.discovery import Discovery, DiscoveryConfig
from services.router.dns import DnsTarget, Resolver
from services.router.registry import RegistryConfig, WorkerRegistry
from services.router.scheduling.profile import load_profile
from services.router.service import RouterService, Scheduler
from services.router.watcher import WatchConfig
from services.worker.engine import Engine
from services.worker.service import WorkerService

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PROFILE = REPO / "deploy/router/profiles/default.yaml"


@dataclass
class RunningWorker:
    engine: Engine
    service: WorkerService
    server: grpc.aio.Server
    address: str
    worker_id: str
    region: str

    async def stop(self, grace_s: float = 0.0) -> None:
        await self.server.stop(grace_s)
        await self.engine.shutdown()


async def start_worker(
    engine: Engine,
    *,
    worker_id: str,
    region: str,
    report_interval_s: float = 0.05,
    host: str = "127.0.0.1",
    port: int = 0,
) -> RunningWorker:
    """A worker listening on ``host:port`` (any loopback address; port 0 picks a free one)."""
    service = WorkerService(
        engine=engine, worker_id=worker_id, region=region, report_interval_s=report_interval_s
    )
    server = new_server()
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    health = Health(["meridian.v1.Worker"])
    health.add_to(server)
    port = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await engine.start()
    service.notify_state_change()
    await health.set_serving(True)
    return RunningWorker(engine, service, server, f"{host}:{port}", worker_id, region)


@dataclass
class RunningRouter:
    server: grpc.aio.Server
    registry: WorkerRegistry
    discovery: Discovery
    address: str
    service: RouterService
    debug: DebugEndpoint | None = None

    @property
    def debug_url(self) -> str:
        assert self.debug is not None, "started without debug="
        return f"http://127.0.0.1:{self.debug.port}"

    async def stop(self) -> None:
        if self.debug is not None:
            await self.debug.stop()
        await self.server.stop(0)
        await self.discovery.stop()

    async def wait_healthy(self, n: int, timeout_s: float = 10.0) -> None:
        """Until ``n`` workers are healthy in the router's view."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            healthy = [s for s in self.registry.snapshots(SYSTEM_CLOCK.monotonic()) if s.healthy]
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
) -> RunningRouter:
    """A router in this event loop. Workers come from ``worker_addresses`` (static), ``dns``
    names (re-resolved every ``dns_interval_s``, through ``resolver`` if given) and
    ``announce_dir``; ``debug`` also starts the debug endpoint."""
    registry = WorkerRegistry(RegistryConfig(stale_after_s=stale_after_s))
    discovery = Discovery(
        registry=registry,
        clock=SYSTEM_CLOCK,
        config=DiscoveryConfig(
            static=tuple(worker_addresses),
            dns=tuple(dns),
            dns_interval_s=dns_interval_s,
            announce_dir=announce_dir,
            announce_interval_s=announce_interval_s,
            watch=WatchConfig(
                report_interval_ms=report_interval_ms, probe_interval_s=probe_interval_s
            ),
        ),
        resolver=resolver,
    )
    service = RouterService(
        registry=registry,
        scheduler=scheduler or load_profile(DEFAULT_PROFILE),
        clock=SYSTEM_CLOCK,
        site=site,
    )
    server = new_server()
    router_pb2_grpc.add_RouterServicer_to_server(service, server)
    port = server.add_insecure_port(listen)
    await server.start()
    discovery.start()
    endpoint = None
    if debug is not None:
        endpoint = DebugEndpoint(config=debug, service=service, membership=discovery.membership)
        await endpoint.start()
    return RunningRouter(server, registry, discovery, f"127.0.0.1:{port}", service, endpoint)


#: The in-process edges' key pepper and admin token (tests only).
TEST_PEPPER = b"meridian-test-pepper-not-secret"
TEST_ADMIN_TOKEN = "meridian-test-admin-token"


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
        config = EdgeConfig(
            port=0,
            site="test",
            plain_http=True,
            admin_port=0,
            admin_token=TEST_ADMIN_TOKEN,
            failover=policy or FailoverPolicy(first_token_timeout_s=10.0),
            request_limits=RequestLimits(max_body_bytes=max_body_bytes),
            keepalive_after_s=keepalive_after_s,
        )
    redis = connect_redis(redis_url)
    server = EdgeServer(
        config=config,
        redis=redis,
        router=RouterClient(router_address),
        hasher=KeyHasher(pepper),
        clock=clock,
        telemetry=telemetry,
    )
    await server.start()
    return RunningEdge(server, server.url, server.deps, redis)


async def stop_all(*things: RunningWorker | RunningRouter | RunningEdge) -> None:
    for thing in things:
        await thing.stop()
