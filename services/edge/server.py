"""One edge replica, assembled and run: its config, its parts, its listeners, its shutdown.

:class:`EdgeServer` builds every part from a validated :class:`EdgeConfig` and the clients it
is given (and owns from then on: ``stop`` closes them), listens (HTTPS, or plain HTTP only
when the config says so; the admin API on its own port), runs the background loops (key
invalidations, lease renewals, the router view) and drains on ``stop``: stop accepting, refuse
new chat requests with 503, let live streams finish within ``drain_grace_s``, then cut what is
left (:meth:`EdgeServer.stop`), then close.

The drain is the edge's own, not aiohttp's: aiohttp's shutdown waits its timeout, cancels only
a request's body (a streaming handler goes on), waits the timeout again, then cancels the
handler and drops the connection — twice the grace, and a stream that ends with a bare TCP
close. Here every API request is known to the :class:`~services.edge.guard.Lifecycle`
(the connection guard enters it); at the deadline each one still running is cut where it is:
a stream gets one OpenAI-style error event and ``[DONE]``, a request with no response yet a
503, and both cancel their worker calls and settle their usage as a request that ends early
does. The process is done within ``drain_grace_s`` + :data:`CUT_WAIT_S` + a moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.grpc_tls import GrpcTls
from services.common.logs import event
from services.common.loopwatch import LoopWatch
from services.common.startup import start_site
from services.common.telemetry import Telemetry
from services.edge.admin import AdminDeps, build_admin_app, token_digest
from services.edge.app import EdgeDeps, build_app
from services.edge.breaker import Breaker
from services.edge.counters import EdgeCounters
from services.edge.guard import GuardConfig, IpBuckets, Lifecycle, Occupancy
from services.edge.migration.policy import MigrationPolicy
from services.edge.observability import EdgeTelemetry
from services.edge.protocol import Listener
from services.edge.ratelimit.limiter import FailureMode, RateLimitConfig, RateLimiter
from services.edge.ratelimit.redis_backend import RedisBackend
from services.edge.ratelimit.window import LocalBackend
from services.edge.redisconn import (
    RedisClient,
    close_client,
    connect,
    follow_failovers,
    parse_redis_url,
)
from services.edge.responses_store import DEFAULT_TTL_S as DEFAULT_RESPONSES_TTL_S
from services.edge.responses_store import MAX_TTL_S as MAX_RESPONSES_TTL_S
from services.edge.responses_store import ResponseStore
from services.edge.stages.validate import RequestLimits
from services.edge.tenancy.apikeys import KeyHasher
from services.edge.tenancy.auth import AuthConfig, Authenticator
from services.edge.tenancy.directory import Directory
from services.edge.tenancy.revocation import InFlightRevocation
from services.edge.tls import TlsConfig, server_context
from services.edge.upstream.failover import FailoverPolicy
from services.edge.upstream.resilient_router import ResilientRouter, ViewConfig
from services.edge.upstream.router_client import RouterClient
from services.edge.upstream.worker_pool import WorkerPool, WorkerTransport
from services.edge.web.assets import AssetStore
from services.edge.web.config import WebConfig
from services.edge.web.feed import FleetHub
from services.edge.web.routes import WebState, instrument
from services.edge.web.sessions import ConsoleSessions

log = logging.getLogger("meridian.edge")

#: After the drain deadline, how long the requests it cut have to send their last bytes
#: (an SSE error event: services/edge/stages/stream.py, CUT_WRITE_TIMEOUT_S) and end.
CUT_WAIT_S = 1.0
#: Then aiohttp closes what is left (connections outside the API pipeline: a page, a
#: health check); its shutdown waits this long, twice at most.
CLOSE_TIMEOUT_S = 0.25


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    site: str = "local"
    tls: TlsConfig | None = None
    #: Plain HTTP must be asked for; without it and without TLS the edge refuses to start.
    plain_http: bool = False
    admin_host: str = "127.0.0.1"
    admin_port: int | None = None  # None: no admin API
    admin_token: str | None = field(default=None, repr=False)
    guard: GuardConfig = field(default_factory=GuardConfig)
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    auth: AuthConfig = field(default_factory=AuthConfig)
    ratelimit: RateLimitConfig = field(default_factory=RateLimitConfig)
    view: ViewConfig = field(default_factory=ViewConfig)
    failover: FailoverPolicy = field(default_factory=FailoverPolicy)
    #: Mid-stream migration (services/edge/migration/): on, bounded, by default.
    migration: MigrationPolicy = field(default_factory=MigrationPolicy)
    #: How token streams reach workers: one Generate call each, or all of a worker's over
    #: one GenerateMux call (services/edge/upstream/worker_pool.py).
    worker_transport: WorkerTransport = "mux"
    #: Mutual TLS to the router and the workers (services/common/grpc_tls.py); None: plaintext.
    grpc_tls: GrpcTls | None = None
    #: SSE before the first token: headers and a comment after ``keepalive_after_s``, then
    #: a comment every ``keepalive_every_s`` (services/edge/stages/stream.py).
    keepalive_after_s: float = 3.0
    keepalive_every_s: float = 10.0
    #: The Responses API's stored responses, kept this long in Redis; 0: none are stored.
    responses_ttl_s: int = DEFAULT_RESPONSES_TTL_S
    drain_grace_s: float = 10.0
    #: Listen with SO_REUSEPORT: one of several edge processes on one port
    #: (``--workers``, services/edge/supervisor.py).
    reuse_port: bool = False
    redis_breaker_open_s: float = 1.0
    #: The chat page and the console (services/edge/web/).
    web: WebConfig = field(default_factory=WebConfig)

    def __post_init__(self) -> None:
        if self.tls is None and not self.plain_http:
            raise ValueError(
                "TLS is required: give a certificate and key, or allow plain HTTP explicitly"
            )
        if self.tls is not None and self.plain_http:
            raise ValueError("choose TLS or plain HTTP, not both")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be 0..65535")
        if self.admin_port is not None:
            if not 0 <= self.admin_port <= 65535:
                raise ValueError("admin_port must be 0..65535")
            if self.admin_token is None:
                raise ValueError("the admin API needs an admin token")
            token_digest(self.admin_token)  # raises if too short
        if not self.drain_grace_s > 0 or not self.keepalive_after_s > 0:
            raise ValueError("drain_grace_s and keepalive_after_s must be > 0")
        if not self.keepalive_every_s > 0:
            raise ValueError("keepalive_every_s must be > 0")
        if not 0 <= self.responses_ttl_s <= MAX_RESPONSES_TTL_S:
            raise ValueError(f"responses_ttl_s must be 0..{MAX_RESPONSES_TTL_S}")


def connect_redis(url: str, *, timeout_s: float = 1.0, max_connections: int = 256) -> RedisClient:
    """The edge's Redis client for ``url``: one server, Sentinel or Cluster (see
    :mod:`services.edge.redisconn` for the URL forms and the connection policy)."""
    return connect(parse_redis_url(url), timeout_s=timeout_s, max_connections=max_connections)


class EdgeServer:
    def __init__(
        self,
        *,
        config: EdgeConfig,
        redis: RedisClient,
        router: RouterClient,
        hasher: KeyHasher,
        clock: Clock = SYSTEM_CLOCK,
        workers: WorkerPool | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.config = config
        self.counters = EdgeCounters()
        self._clock = clock
        self._redis = redis
        #: The event loop's own stalls, so a Redis timeout they explain is not Redis's.
        self.loop_watch = LoopWatch()
        breaker = Breaker(
            clock=clock,
            counters=self.counters,
            open_for_s=config.redis_breaker_open_s,
            watch=self.loop_watch,
        )
        self.directory = Directory(redis=redis, hasher=hasher, clock=clock)
        rl = config.ratelimit
        self.limiter = RateLimiter(
            redis=RedisBackend(redis=redis, window_ms=rl.window_ms, lease_ms=rl.lease_ms),
            local=LocalBackend(window_ms=rl.window_ms, lease_ms=rl.lease_ms),
            breaker=breaker,
            counters=self.counters,
            clock=clock,
            config=rl,
        )
        self.auth = Authenticator(
            directory=self.directory,
            hasher=hasher,
            clock=clock,
            breaker=breaker,
            counters=self.counters,
            config=config.auth,
            serve_stale=rl.failure_mode is FailureMode.OPEN,
        )
        self.router = ResilientRouter(
            client=router, clock=clock, counters=self.counters, config=config.view
        )
        lifecycle = Lifecycle()
        self.revocation = InFlightRevocation(
            auth=self.auth,
            lifecycle=lifecycle,
            counters=self.counters,
            tracer=telemetry.tracer if telemetry else None,
            clock=clock,
        )
        guard = config.guard
        streams = Occupancy(max_total=guard.max_streams, max_per_ip=guard.max_streams_per_ip)
        self.telemetry = EdgeTelemetry(
            tracer=telemetry.tracer if telemetry else None,
            meter=telemetry.meter if telemetry else None,
            counters=self.counters,
            active_streams=lambda: streams.total,
            loop_stalled_s=lambda: self.loop_watch.total_s,
        )
        self.deps = EdgeDeps(
            redis=redis,
            auth=self.auth,
            limiter=self.limiter,
            router=self.router,
            workers=workers
            or WorkerPool(config.worker_transport, self.counters, tls=config.grpc_tls),
            counters=self.counters,
            lifecycle=lifecycle,
            connections=Occupancy(
                max_total=guard.max_connections, max_per_ip=guard.max_connections_per_ip
            ),
            streams=streams,
            ip_buckets=IpBuckets(rate=guard.ip_requests_per_s, burst=guard.ip_burst, clock=clock),
            site=config.site,
            policy=config.failover,
            migration=config.migration,
            guard=guard,
            request_limits=config.request_limits,
            keepalive_after_s=config.keepalive_after_s,
            keepalive_every_s=config.keepalive_every_s,
            telemetry=self.telemetry,
            revocation=self.revocation,
            responses=ResponseStore(redis, ttl_s=config.responses_ttl_s, breaker=breaker)
            if config.responses_ttl_s
            else None,
        )
        self.web = self._web_state(config, redis, router, telemetry)
        self.app = build_app(self.deps, self.web)
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        self._admin_runner: web.AppRunner | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.port = 0
        self.admin_port: int | None = None

    def _web_state(
        self,
        config: EdgeConfig,
        redis: RedisClient,
        router: RouterClient,
        telemetry: Telemetry | None,
    ) -> WebState:
        """The pages' parts: assets read once, the console's feed and sessions (a console
        only with an admin token)."""
        sessions = None
        if config.admin_token is not None:
            sessions = ConsoleSessions(
                redis=redis,
                admin_token_sha256=token_digest(config.admin_token),
                ttl_s=config.web.session_ttl_s,
                tls=config.tls is not None,
                clock=self._clock,
                login_failures_per_minute=config.web.login_failures_per_minute,
            )
        state = WebState(
            config=config.web,
            assets=AssetStore(hsts=config.tls is not None),
            hub=FleetHub(
                watch=router.watch_fleet,
                config=config.web,
                site=config.site,
                counters=self.counters.snapshot,
            ),
            sessions=sessions,
            auth=self.auth,
            router=router,
            counters=self.counters,
            body_timeout_s=config.guard.body_timeout_s,
            write_timeout_s=config.guard.write_timeout_s,
        )
        instrument(state, telemetry.meter if telemetry else None)
        return state

    @property
    def scheme(self) -> str:
        return "https" if self.config.tls else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{_url_host(self.config.host)}:{self.port}"

    @property
    def admin_url(self) -> str | None:
        if self.admin_port is None:
            return None
        return f"http://{_url_host(self.config.admin_host)}:{self.admin_port}"

    def gauges(self) -> dict[str, Any]:
        age = self.router.view_age_s()
        return {
            "connections": self.deps.connections.total,
            "streams": self.deps.streams.total,
            "live_leases": self.limiter.live_leases,
            "draining": self.deps.lifecycle.draining,
            "router_view_age_s": None if age is None else round(age, 3),
            "event_loop_stalled_s": round(self.loop_watch.total_s, 3),
            "event_loop_worst_stall_s": round(self.loop_watch.worst_s, 3),
        }

    async def start(self) -> None:
        cfg = self.config
        ssl_context = server_context(cfg.tls) if cfg.tls else None
        self._runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            access_log=None,
            # The drain's grace is waited by stop() (_drain), not by aiohttp.
            shutdown_timeout=CLOSE_TIMEOUT_S,
        )
        await self._runner.setup()
        assert self._runner.server is not None
        self._listener = Listener(
            server=self._runner.server,
            host=cfg.host,
            port=cfg.port,
            ssl_context=ssl_context,
            config=cfg.guard,
            connections=self.deps.connections,
            counters=self.counters,
            reuse_port=cfg.reuse_port,
        )
        self.port = await self._listener.start()
        if cfg.admin_port is not None and cfg.admin_token is not None:
            admin = build_admin_app(
                AdminDeps(
                    directory=self.directory,
                    counters=self.counters,
                    gauges=self.gauges,
                    token_sha256=token_digest(cfg.admin_token),
                    now_ms=lambda: int(self._clock.time() * 1000),
                )
            )
            # Bodies are decoded by admin.py (request_body.py), as on the public listener.
            self._admin_runner = web.AppRunner(admin, access_log=None, auto_decompress=False)
            await self._admin_runner.setup()
            site = web.TCPSite(self._admin_runner, cfg.admin_host, cfg.admin_port)
            await start_site(site, "the admin API", cfg.admin_host, cfg.admin_port)
            self.admin_port = int(self._admin_runner.addresses[0][1])
        self._spawn(self.loop_watch.run(self._stop))
        self._spawn(self.auth.listen(self._redis, self._stop))
        self._spawn(self.limiter.run(self._stop))
        self._spawn(self.router.run(self._stop))
        self._spawn(follow_failovers(self._redis, self._stop))

    async def _drain(self) -> None:
        """Wait up to ``drain_grace_s`` for the API requests in flight; then cut those still
        running (each ends as :meth:`services.edge.guard.Lifecycle.cut` says), and give them
        :data:`CUT_WAIT_S` to end."""
        assert self._runner is not None
        if self._runner.server is not None:
            # Idle keep-alive connections close now, busy ones once their response is over.
            self._runner.server.pre_shutdown()
        lifecycle = self.deps.lifecycle
        grace = self.config.drain_grace_s
        if await lifecycle.wait_idle(grace):
            return
        cut = lifecycle.cut()
        self.counters.drain_streams_cut += cut.streams
        self.counters.drain_requests_cut += cut.requests
        event(
            log,
            "edge.drain_deadline",
            level=logging.WARNING,
            grace_s=grace,
            streams_cut=cut.streams,
            requests_cut=cut.requests,
        )
        if not await lifecycle.wait_idle(CUT_WAIT_S):
            # What did not end by now is cancelled, its connection dropped, by aiohttp.
            event(log, "edge.drain_forced", level=logging.WARNING, requests=lifecycle.in_flight)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coro))

    def begin_drain(self) -> None:
        """Stop accepting connections and refuse new chat requests (503); streams go on."""
        self.deps.lifecycle.draining = True
        self.web.hub.close()  # console streams end now; they would only hold the drain up
        if self._listener is not None:
            self._listener.close()

    async def stop(self) -> None:
        """Drain (up to ``drain_grace_s`` for live streams, then cut the rest: :meth:`_drain`),
        then close everything."""
        self.begin_drain()
        if self._runner is not None:
            await self._drain()
            await self._runner.cleanup()
            self._runner = None
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.revocation.close()
        await self.web.hub.aclose()
        await self.limiter.close()
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
            self._admin_runner = None
        await self.deps.workers.close()
        await self.router.close()
        await close_client(self._redis)


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
