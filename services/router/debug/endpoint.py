"""The router's debug endpoint: an HTTP admin port for operators (``--debug-port``).

    GET /debug/view                       the live view: every worker, membership, counters,
                                          per-plugin timings (p50/p99/max µs per decision)
    GET /debug/route?model=M[&priority=high&allowed_regions=kr,jp&client_region=kr
                    &edge_site=seoul&prompt_tokens=900&max_tokens=256&exclude=kr-1
                    &explain=1]           a dry-run decision with per-signal contributions
                                          and the filters' verdicts (nothing is assigned)
    GET /debug/decisions[?n=50]           the last N decisions this replica made, newest first
    GET /debug/timings                    per-plugin timing statistics only

Answers are JSON (see ``views.py``). ``/debug/route`` validates its parameters exactly like the
Route RPC (it builds a ``RouteRequest`` and goes through the same checks) and answers 400 with
``{"error": {"message", "param"}}`` for bad input; an empty decision is a 200 whose ``error``
says what the RPC would have answered (status, reason, retry-after). Session and prefix hashes
are not accepted: a dry run must not teach the affinity tables.

Access: with a token configured, every request needs ``Authorization: Bearer <token>``
(compared in constant time; 401 otherwise). Without one, the port must be bound to a loopback
address — :class:`DebugConfig` refuses anything else, so the view is never exposed by accident.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from meridian.v1 import router_pb2
from services.common.errors import InvalidRequest, MeridianError
from services.common.httpapp import hide_version_banner
from services.common.logs import event
from services.common.startup import start_site
from services.router.debug.payloads import (
    counters_json,
    decision_json,
    journal_entry_json,
    timings_json,
    worker_json,
)
from services.router.discovery.membership import Membership
from services.router.service import RouterService, error_for, query_from_pb

log = logging.getLogger("meridian.router.debug")

MAX_RECENT = 1000
_PRIORITIES = {
    "low": router_pb2.PRIORITY_LOW,
    "standard": router_pb2.PRIORITY_STANDARD,
    "high": router_pb2.PRIORITY_HIGH,
}
_ROUTE_PARAMS = {
    "model",
    "priority",
    "allowed_regions",
    "client_region",
    "edge_site",
    "prompt_tokens",
    "max_tokens",
    "exclude",
    "explain",
    "tenant_id",
}


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class DebugConfig:
    """Where the debug endpoint listens and who may read it.

    ``host``/``port``: the admin listener (port 0 picks a free one). ``token``: required as a
    bearer token when set; mandatory unless ``host`` is a loopback address.
    """

    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("debug port must be 0..65535")
        if self.token is not None and (not self.token or len(self.token) < 16):
            raise ValueError("the debug token must be at least 16 characters")
        if self.token is None and not _loopback(self.host):
            raise ValueError(
                f"the debug endpoint on {self.host} (not loopback) needs a token "
                "(--debug-token-file or MERIDIAN_ROUTER_DEBUG_TOKEN)"
            )


class BadParam(ValueError):
    """A ``/debug/route`` or ``/debug/decisions`` query parameter that cannot be used."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "param": param}}, status=status)


def _integer(query: Any, name: str, default: int, *, lo: int, hi: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not lo <= int(raw) <= hi:
        raise BadParam(name, f"{name} must be an integer in {lo}..{hi}, got {raw!r}")
    return int(raw)


def _flag(query: Any, name: str, default: bool) -> bool:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise BadParam(name, f"{name} must be 1/0 or true/false, got {raw!r}")


def _names(query: Any, name: str) -> list[str]:
    raw = query.get(name, "")
    return [part.strip() for part in raw.split(",") if part.strip()]


def route_request_from_query(query: Any) -> tuple[router_pb2.RouteRequest, bool]:
    """Build the RouteRequest a ``/debug/route`` query string describes, and ``explain``."""
    unknown = sorted(set(query) - _ROUTE_PARAMS)
    if unknown:
        known = ", ".join(sorted(_ROUTE_PARAMS))
        raise BadParam(unknown[0], f"unknown parameter {unknown[0]!r} (known: {known})")
    priority_name = query.get("priority", "standard").lower()
    if priority_name not in _PRIORITIES:
        raise BadParam("priority", f"priority must be low, standard or high, got {priority_name!r}")
    req = router_pb2.RouteRequest(
        request_id=f"debug-{time.monotonic_ns()}",
        model=query.get("model", ""),
        tenant_id=query.get("tenant_id", ""),
        priority=_PRIORITIES[priority_name],
        allowed_regions=_names(query, "allowed_regions"),
        edge_site=query.get("edge_site", ""),
        client_region=query.get("client_region", ""),
        prompt_tokens=_integer(query, "prompt_tokens", 0, lo=0, hi=10_000_000),
        max_tokens=_integer(query, "max_tokens", 0, lo=0, hi=10_000_000),
        exclude_worker_ids=_names(query, "exclude"),
    )
    return req, _flag(query, "explain", True)


class DebugEndpoint:
    """The aiohttp application and its listener."""

    def __init__(
        self, *, config: DebugConfig, service: RouterService, membership: Membership | None = None
    ) -> None:
        self._config = config
        self._service = service
        self._membership = membership
        self._runner: web.AppRunner | None = None
        self.port = 0

    def app(self) -> web.Application:
        app = hide_version_banner(web.Application(middlewares=[self._auth]))
        app.router.add_get("/debug/view", self._view)
        app.router.add_get("/debug/route", self._route)
        app.router.add_get("/debug/decisions", self._decisions)
        app.router.add_get("/debug/timings", self._timings)
        return app

    async def start(self) -> int:
        """Listen; returns the bound port."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._config.host, self._config.port)
        await start_site(site, "the debug endpoint", self._config.host, self._config.port)
        self.port = self._runner.addresses[0][1]
        event(log, "debug.listening", host=self._config.host, port=self.port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        token = self._config.token
        if token is not None:
            given = request.headers.get("Authorization", "")
            scheme, _, value = given.partition(" ")
            ok = scheme.lower() == "bearer" and hmac.compare_digest(
                value.strip().encode(), token.encode()
            )
            if not ok:
                event(
                    log,
                    "debug.denied",
                    level=logging.WARNING,
                    path=request.path,
                    remote=request.remote,
                )
                resp = _error(401, "a valid bearer token is required")
                resp.headers["WWW-Authenticate"] = 'Bearer realm="meridian-router-debug"'
                return resp
        return await handler(request)

    async def _view(self, request: web.Request) -> web.Response:
        svc = self._service
        fleet = svc.fleet
        snaps = sorted(
            fleet.snapshots(svc.clock.monotonic()), key=lambda s: (s.region, s.worker_id)
        )
        body: dict[str, Any] = {
            "router_site": svc.site,
            "profile": svc.profile,
            "generated_unix_ms": int(time.time() * 1000),
            "workers": [worker_json(s, fleet.last_report(s.worker_id)) for s in snaps],
            "decisions": counters_json(svc.journal),
            "plugin_timings_us": timings_json(svc.timings.summary()),
        }
        if self._membership is not None:
            body["membership"] = {
                source: sorted(addresses)
                for source, addresses in sorted(self._membership.sources().items())
            }
        return web.json_response(body)

    async def _route(self, request: web.Request) -> web.Response:
        try:
            pb, explain = route_request_from_query(request.query)
            query = query_from_pb(pb)
        except BadParam as err:
            return _error(400, err.message, err.param)
        except InvalidRequest as err:
            return _error(400, err.message, err.param)
        decision, us = self._service.dry_run(query)
        error: MeridianError | None = None if decision.ranked else error_for(decision, query)
        return web.json_response(
            decision_json(
                decision, query, decision_id="", decision_us=us, error=error, explain=explain
            )
        )

    async def _decisions(self, request: web.Request) -> web.Response:
        try:
            n = _integer(request.query, "n", 50, lo=1, hi=MAX_RECENT)
        except BadParam as err:
            return _error(400, err.message, err.param)
        entries = self._service.journal.recent(n)
        return web.json_response(
            {
                "router_site": self._service.site,
                "decisions": [
                    journal_entry_json(
                        e, None if e.decision.ranked else error_for(e.decision, e.query)
                    )
                    for e in entries
                ],
            }
        )

    async def _timings(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "router_site": self._service.site,
                "decisions": self._service.timings.decisions,
                "plugin_timings_us": timings_json(self._service.timings.summary()),
            }
        )
