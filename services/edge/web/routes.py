"""The web routes, added to the public app beside the API (``app.build_app``). Every one
passes the same middlewares as the API — telemetry (a SERVER span, requests by route and
status), the error boundary, the per-IP request bucket — and none is on the chat path.

    GET  /                          the chat page (static; the API key stays in the browser)
    GET  /static/{name}             scripts, styles, vendored libraries, the world map
    GET  /v1/explanations/{id}      the router's explanation of one request (API key)
    GET  /console                   the fleet map (console session), else 401 + the sign-in page
    POST /console/session           sign in: form field ``token`` (the admin token) → cookie
    POST /console/logout            sign out
    GET  /console/events            the map's server-sent events (console session)
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from dataclasses import dataclass

from aiohttp import web
from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeter, Observation

from services.common import metric_names as mn
from services.common.errors import InvalidRequest, NotFound, PayloadTooLarge, Unavailable
from services.common.logs import event
from services.edge.counters import EdgeCounters
from services.edge.middleware.error_boundary import expect_handler
from services.edge.tenancy.auth import Authenticator
from services.edge.upstream.router_client import RouterClient
from services.edge.web.assets import CACHE_PRIVATE, CACHE_REVALIDATE, CACHE_VERSIONED, AssetStore
from services.edge.web.config import WebConfig
from services.edge.web.explain import explanation_handler
from services.edge.web.feed import FleetHub, Mailbox
from services.edge.web.sessions import ConsoleSessions, NoSession, Session, same_origin

log = logging.getLogger("meridian.edge.console")

_MAX_LOGIN_BODY = 4096
_SESSION_ENDED = b'event: session\ndata: {"ended":true}\n\n'
_EVENT_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-store",
    "X-Accel-Buffering": "no",
}


class ConsoleOff(NotFound):
    """This edge has no admin token, so no console."""


@dataclass(slots=True, kw_only=True)
class WebState:
    """Everything the web routes use; built by EdgeServer."""

    config: WebConfig
    assets: AssetStore
    hub: FleetHub
    sessions: ConsoleSessions | None  # None: no admin token, no console
    auth: Authenticator
    router: RouterClient
    counters: EdgeCounters
    body_timeout_s: float = 30.0
    write_timeout_s: float = 30.0
    streams_opened: int = 0
    bytes_sent: int = 0


def instrument(state: WebState, meter: Meter | None) -> None:
    """The console's gauges and counters (pages themselves are counted by the telemetry
    middleware, by route and status)."""
    meter = meter or NoOpMeter("meridian.edge.web")
    hub = state.hub

    def streams(options: CallbackOptions) -> list[Observation]:
        return [Observation(hub.open_streams)]

    def dropped(options: CallbackOptions) -> list[Observation]:
        return [Observation(hub.dropped())]

    def sent(options: CallbackOptions) -> list[Observation]:
        return [Observation(state.bytes_sent)]

    meter.create_observable_gauge(
        mn.EDGE_CONSOLE_STREAMS,
        callbacks=[streams],
        unit="{stream}",
        description="Open console event streams",
    )
    meter.create_observable_gauge(
        mn.EDGE_CONSOLE_DROPPED,
        callbacks=[dropped],
        unit="{message}",
        description="Decisions and events dropped for slow consoles (open streams)",
    )
    meter.create_observable_counter(
        mn.EDGE_CONSOLE_BYTES, callbacks=[sent], unit="By", description="Console event bytes sent"
    )


WEB = web.AppKey("web", WebState)


def add_web_routes(app: web.Application, state: WebState) -> None:
    app[WEB] = state
    app.router.add_get("/", chat_page, expect_handler=expect_handler)
    app.router.add_get(
        "/static/{name:[A-Za-z0-9_./-]+}", static_file, expect_handler=expect_handler
    )
    app.router.add_get(
        "/v1/explanations/{request_id}",
        explanation_handler(auth=state.auth, router=state.router),
        expect_handler=expect_handler,
    )
    app.router.add_get("/console", console_page, expect_handler=expect_handler)
    app.router.add_post("/console/session", console_login, expect_handler=expect_handler)
    app.router.add_post("/console/logout", console_logout, expect_handler=expect_handler)
    app.router.add_get("/console/events", console_events, expect_handler=expect_handler)


async def chat_page(request: web.Request) -> web.Response:
    state = request.app[WEB]
    asset = state.assets.get("index.html")
    assert asset is not None
    return state.assets.respond(request, asset, cache=CACHE_REVALIDATE)


async def static_file(request: web.Request) -> web.Response:
    state = request.app[WEB]
    name = request.match_info["name"]
    asset = state.assets.get(name) if not name.endswith(".html") and ".." not in name else None
    if asset is None:
        raise NotFound(f"Unknown path: {request.method} {request.path}")
    current = request.query.get("v") == asset.version
    return state.assets.respond(
        request, asset, cache=CACHE_VERSIONED if current else CACHE_REVALIDATE
    )


def _sessions(state: WebState) -> ConsoleSessions:
    if state.sessions is None:
        raise ConsoleOff("The console is off: this edge was started without an admin token.")
    return state.sessions


async def console_page(request: web.Request) -> web.Response:
    state = request.app[WEB]
    sessions = _sessions(state)
    try:
        await sessions.check(request)
    except NoSession:
        login = state.assets.get("login.html")
        assert login is not None
        return state.assets.respond(request, login, cache=CACHE_PRIVATE, status=401)
    page = state.assets.get("console.html")
    assert page is not None
    return state.assets.respond(request, page, cache=CACHE_PRIVATE)


async def _form_token(request: web.Request, timeout_s: float) -> str:
    if request.content_type != "application/x-www-form-urlencoded":
        raise InvalidRequest("sign in with the form: token=<admin token>", param="token")
    if (request.content_length or 0) > _MAX_LOGIN_BODY:
        raise PayloadTooLarge("the sign-in form is too large")
    async with asyncio.timeout(timeout_s):
        body = await request.content.read(_MAX_LOGIN_BODY + 1)
    if len(body) > _MAX_LOGIN_BODY:
        raise PayloadTooLarge("the sign-in form is too large")
    try:
        fields = urllib.parse.parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
    except ValueError:  # more than max_num_fields: a form the console never sends
        raise InvalidRequest("the form needs one field named token", param="token") from None
    tokens = fields.get("token", [])
    if len(tokens) != 1 or not tokens[0].strip():
        raise InvalidRequest("the form needs one field named token", param="token")
    return tokens[0].strip()


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def _require_same_origin(request: web.Request) -> None:
    if not same_origin(request):
        raise InvalidRequest("cross-origin console requests are refused", param="Origin")


async def console_login(request: web.Request) -> web.Response:
    state = request.app[WEB]
    sessions = _sessions(state)
    _require_same_origin(request)
    try:
        token = await _form_token(request, state.body_timeout_s)
    except (InvalidRequest, UnicodeError):
        return _redirect("/console?denied=1")
    made = await sessions.login(request, token)
    if made is None:
        event(log, "console.login_refused", level=logging.WARNING, ip=request.remote)
        return _redirect("/console?denied=1")
    sid, session = made
    event(log, "console.login", session=session.tag, ip=request.remote)
    resp = _redirect("/console")
    sessions.set_cookie(resp, sid)
    return resp


async def console_logout(request: web.Request) -> web.Response:
    state = request.app[WEB]
    sessions = _sessions(state)
    _require_same_origin(request)
    await sessions.logout(request)
    resp = _redirect("/console")
    sessions.clear_cookie(resp)
    return resp


async def console_events(request: web.Request) -> web.StreamResponse:
    state = request.app[WEB]
    sessions = _sessions(state)
    session = await sessions.check(request)
    box = state.hub.subscribe(session.digest)
    state.streams_opened += 1
    event(log, "console.stream_opened", session=session.tag, open=state.hub.open_streams)
    resp = web.StreamResponse(headers={**state.assets.headers(), **_EVENT_HEADERS})
    started = time.monotonic()
    try:
        await resp.prepare(request)
        await _write(request, resp, b"retry: 3000\n\n", state)
        await _pump(request, resp, box, session, sessions, state)
    except (ConnectionError, TimeoutError):
        pass
    finally:
        state.hub.unsubscribe(box)
        event(
            log,
            "console.stream_closed",
            session=session.tag,
            open=state.hub.open_streams,
            seconds=round(time.monotonic() - started, 1),
            dropped_decisions=box.dropped_decisions,
            dropped_events=box.dropped_events,
        )
    return resp


async def _pump(
    request: web.Request,
    resp: web.StreamResponse,
    box: Mailbox,
    session: Session,
    sessions: ConsoleSessions,
    state: WebState,
) -> None:
    """Write what the mailbox holds until the session ends, the client goes, or the edge
    drains. An idle stream gets a heartbeat comment, and the session is checked again."""
    heartbeat_s = state.config.heartbeat_s
    next_check = time.monotonic() + heartbeat_s
    while not box.closed():
        wait_s = min(heartbeat_s, max(0.0, session.expires_at - time.time()))
        woke = await box.wait(wait_s)
        if box.closed():
            return
        if time.time() >= session.expires_at:
            await _write(request, resp, _SESSION_ENDED, state)
            return
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + heartbeat_s
            try:
                session = await sessions.lookup(session.digest)
            except NoSession:  # signed out (in another tab, say)
                await _write(request, resp, _SESSION_ENDED, state)
                return
            except Unavailable:
                pass  # Redis is down: a stream already open goes on until its session expires
            if not woke:
                await _write(request, resp, b": keepalive\n\n", state)
        if woke:
            data = box.take()
            if data:
                await _write(request, resp, data, state)


async def _write(
    request: web.Request, resp: web.StreamResponse, data: bytes, state: WebState
) -> None:
    """One bounded write: a console that stopped reading is cut off after the edge's write
    timeout (its mailbox meanwhile coalesces, see feed.py)."""
    try:
        async with asyncio.timeout(state.write_timeout_s):
            await resp.write(data)
    except TimeoutError:
        state.counters.write_timeouts += 1
        if request.transport is not None:
            request.transport.abort()
        raise
    state.bytes_sent += len(data)
