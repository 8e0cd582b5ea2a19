"""The edge's public aiohttp application: routes, the chat pipeline and the error boundary.

Dependencies (Redis, authenticator, limiter, router, worker pool, clock) are built by the
caller (:mod:`services.edge.server`) and stored under typed ``web.AppKey``s; nothing here reads
globals or the environment. The admin API is a separate application on its own port
(:mod:`services.edge.admin`) and is never mounted here.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from services.common import capabilities
from services.common.errors import InvalidRequest, ModelNotFound, NotFound
from services.common.httpapp import hide_version_banner
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.dialects.base import Dialect
from services.edge.dialects.chat import CHAT as CHAT_DIALECT
from services.edge.dialects.completions import COMPLETIONS as COMPLETIONS_DIALECT
from services.edge.dialects.embeddings import EMBEDDINGS as EMBEDDINGS_DIALECT
from services.edge.dialects.responses import RESPONSES as RESPONSES_DIALECT
from services.edge.dialects.responses import ResponsesDialect
from services.edge.guard import GuardConfig, IpBuckets, Lifecycle, Occupancy
from services.edge.middleware.error_boundary import RESPONSE_HEADERS, error_boundary, expect_handler
from services.edge.middleware.ip_guard import ip_guard
from services.edge.middleware.telemetry import TRACE_ID, telemetry_middleware
from services.edge.migration.policy import MigrationPolicy
from services.edge.observability import EdgeTelemetry
from services.edge.openai_responses import RESPONSE_ID, in_responses_terms
from services.edge.pipeline import (
    STAGE_ORDERS,
    Next,
    Stage,
    TerminalStage,
    build_chain,
    ordered_middlewares,
)
from services.edge.ratelimit.limiter import FailureMode, RateLimiter, RateLimitExceeded
from services.edge.ratelimit.types import Ask
from services.edge.redisconn import REDIS_FAILURES, RedisClient
from services.edge.responses_store import ResponseStore
from services.edge.stages.admit import Admit, scopes_for
from services.edge.stages.authenticate import Authenticate
from services.edge.stages.connection_guard import ConnectionGuard
from services.edge.stages.embed import Embed
from services.edge.stages.route import Route
from services.edge.stages.stream import Stream
from services.edge.stages.stream_completion import CompletionStream
from services.edge.stages.stream_response import ResponsesStream
from services.edge.stages.validate import RequestLimits, Validate
from services.edge.tenancy.auth import Authenticator, Principal
from services.edge.tenancy.revocation import InFlightRevocation
from services.edge.upstream.failover import FailoverPolicy
from services.edge.upstream.resilient_router import ResilientRouter
from services.edge.upstream.worker_pool import WorkerPool
from services.edge.web.routes import WebState, add_web_routes


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeDeps:
    redis: RedisClient
    auth: Authenticator
    limiter: RateLimiter
    router: ResilientRouter
    workers: WorkerPool
    counters: EdgeCounters
    lifecycle: Lifecycle
    connections: Occupancy
    streams: Occupancy
    ip_buckets: IpBuckets
    site: str
    policy: FailoverPolicy
    migration: MigrationPolicy
    guard: GuardConfig
    request_limits: RequestLimits
    telemetry: EdgeTelemetry
    keepalive_after_s: float = 3.0
    keepalive_every_s: float = 10.0
    #: Ends requests whose key is revoked (or runs out) while they run.
    revocation: InFlightRevocation | None = None
    #: The Responses API's stored responses; None: nothing is stored (``store: false``).
    responses: ResponseStore | None = None


DEPS = web.AppKey("deps", EdgeDeps)
CHAT: web.AppKey[Next] = web.AppKey("chat_pipeline")
COMPLETIONS: web.AppKey[Next] = web.AppKey("completions_pipeline")
EMBEDDINGS: web.AppKey[Next] = web.AppKey("embeddings_pipeline")
RESPONSES: web.AppKey[Next] = web.AppKey("responses_pipeline")


def shared_stages(deps: EdgeDeps, dialect: Dialect) -> list[Stage]:
    """The stages every endpoint passes before its terminal, for ``dialect``'s endpoint."""
    return [
        ConnectionGuard(streams=deps.streams, lifecycle=deps.lifecycle, counters=deps.counters),
        Authenticate(
            auth=deps.auth,
            expiring=deps.revocation.expires if deps.revocation is not None else None,
        ),
        Validate(
            limits=deps.request_limits,
            body_timeout_s=deps.guard.body_timeout_s,
            counters=deps.counters,
            dialect=dialect,
        ),
        Admit(limiter=deps.limiter, dialect=dialect),
        Route(router=deps.router, site=deps.site, dialect=dialect),
    ]


def completions_stages(deps: EdgeDeps) -> tuple[list[Stage], TerminalStage]:
    """POST /v1/completions: the shared stages, then the text-completion stream stage."""
    return (
        shared_stages(deps, COMPLETIONS_DIALECT),
        CompletionStream(
            router=deps.router,
            workers=deps.workers,
            policy=deps.policy,
            counters=deps.counters,
            telemetry=deps.telemetry,
            keepalive_after_s=deps.keepalive_after_s,
            keepalive_every_s=deps.keepalive_every_s,
            write_timeout_s=deps.guard.write_timeout_s,
        ),
    )


def embeddings_stages(deps: EdgeDeps) -> tuple[list[Stage], TerminalStage]:
    """POST /v1/embeddings: the shared stages, then one Embed call."""
    return (
        shared_stages(deps, EMBEDDINGS_DIALECT),
        Embed(
            router=deps.router,
            workers=deps.workers,
            policy=deps.policy,
            counters=deps.counters,
            telemetry=deps.telemetry,
        ),
    )


def chat_stages(deps: EdgeDeps) -> tuple[list[Stage], TerminalStage]:
    """Every stage of the declared order (services.edge.pipeline.CHAT_STAGE_ORDER), built."""
    return shared_stages(deps, CHAT_DIALECT), _chat_stream(Stream, deps)


def responses_stages(deps: EdgeDeps) -> tuple[list[Stage], TerminalStage]:
    """POST /v1/responses: chat's stages with the Responses dialect and rendering, both
    with the store of responses (``previous_response_id`` reads it, a finished one is kept)."""
    dialect = ResponsesDialect(deps.responses)
    terminal = _chat_stream(ResponsesStream, deps, store=deps.responses)
    return shared_stages(deps, dialect), terminal


def _chat_stream(kind: type[Stream], deps: EdgeDeps, **extra: Any) -> Stream:
    return kind(
        **extra,
        router=deps.router,
        workers=deps.workers,
        policy=deps.policy,
        migration=deps.migration,
        fleet=deps.router,
        counters=deps.counters,
        telemetry=deps.telemetry,
        keepalive_after_s=deps.keepalive_after_s,
        keepalive_every_s=deps.keepalive_every_s,
        write_timeout_s=deps.guard.write_timeout_s,
    )


def build_chat_pipeline(deps: EdgeDeps) -> Next:
    stages, terminal = chat_stages(deps)
    return build_chain(stages, terminal, tracer=deps.telemetry.tracer)


def build_completions_pipeline(deps: EdgeDeps) -> Next:
    stages, terminal = completions_stages(deps)
    return build_chain(
        stages, terminal, tracer=deps.telemetry.tracer, order=STAGE_ORDERS["completions"]
    )


def build_responses_pipeline(deps: EdgeDeps) -> Next:
    stages, terminal = responses_stages(deps)
    return build_chain(
        stages, terminal, tracer=deps.telemetry.tracer, order=STAGE_ORDERS["responses"]
    )


def build_embeddings_pipeline(deps: EdgeDeps) -> Next:
    stages, terminal = embeddings_stages(deps)
    return build_chain(
        stages, terminal, tracer=deps.telemetry.tracer, order=STAGE_ORDERS["embeddings"]
    )


def _context(request: web.Request, id_prefix: str) -> ChatContext:
    request_id = f"{id_prefix}{uuid.uuid4().hex}"
    headers = {"x-request-id": request_id}
    trace_id = request.get(TRACE_ID)
    if trace_id:
        headers["x-trace-id"] = trace_id
    ctx = ChatContext(request=request, request_id=request_id, headers=headers)
    request[RESPONSE_HEADERS] = ctx.headers
    return ctx


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await request.app[CHAT](_context(request, CHAT_DIALECT.id_prefix))


async def completions(request: web.Request) -> web.StreamResponse:
    return await request.app[COMPLETIONS](_context(request, COMPLETIONS_DIALECT.id_prefix))


async def responses(request: web.Request) -> web.StreamResponse:
    try:
        return await request.app[RESPONSES](_context(request, RESPONSES_DIALECT.id_prefix))
    except InvalidRequest as err:
        # Past validation the request is chat's (routing, the worker): name the fields as
        # the client sent them (max_output_tokens, text.format, input), not chat's.
        raise in_responses_terms(err) from None


async def stored_response(request: web.Request) -> web.Response:
    """GET /v1/responses/{id}: a stored response, as the caller's tenant stored it (another
    tenant's, an expired or an unknown one: 404)."""
    store, tenant_id, response_id = await _stored(request)
    stored = await store.get(tenant_id, response_id)
    if stored is None:
        raise _no_response(response_id)
    return web.json_response(stored.response, headers=request[RESPONSE_HEADERS])


async def stored_input_items(request: web.Request) -> web.Response:
    """GET /v1/responses/{id}/input_items: the input items of that turn, in order."""
    store, tenant_id, response_id = await _stored(request)
    stored = await store.get(tenant_id, response_id)
    if stored is None:
        raise _no_response(response_id)
    page = input_items_page(stored.input_items, request.query)
    return web.json_response(page, headers=request[RESPONSE_HEADERS])


#: ``limit`` of a list endpoint, as OpenAI bounds it.
LIST_LIMIT_MAX = 100
LIST_LIMIT_DEFAULT = 20


def input_items_page(items: list[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """One page of a list, as OpenAI's list endpoints answer: ``order`` (``desc``, newest
    first, by default), at most ``limit`` (1..100, default 20), starting after the item whose
    id is ``after``; ``has_more`` says whether another page follows."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest(
            f"Invalid value for 'order': expected 'asc' or 'desc', got {order[:40]!r}.",
            param="order",
        )
    text = query.get("limit", str(LIST_LIMIT_DEFAULT))
    limit = int(text) if text.isascii() and text.isdigit() and len(text) < 6 else 0
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise InvalidRequest(
            f"Invalid value for 'limit': expected an integer from 1 to {LIST_LIMIT_MAX}, "
            f"got {text[:40]!r}.",
            param="limit",
        )
    ordered = items if order == "asc" else items[::-1]
    start = 0
    after = query.get("after")
    if after is not None:
        at = next((i for i, item in enumerate(ordered) if item.get("id") == after), None)
        if at is None:
            raise InvalidRequest(
                f"Invalid value for 'after': no input item of this response has the id "
                f"{after[:80]!r}.",
                param="after",
            )
        start = at + 1
    page = ordered[start : start + limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(ordered),
    }


async def delete_stored_response(request: web.Request) -> web.Response:
    store, tenant_id, response_id = await _stored(request)
    if not await store.delete(tenant_id, response_id):
        raise _no_response(response_id)
    return web.json_response(
        {"id": response_id, "object": "response", "deleted": True},
        headers=request[RESPONSE_HEADERS],
    )


async def cancel_response(request: web.Request) -> web.Response:
    """POST /v1/responses/{id}/cancel: only background responses can be cancelled, and none
    run in the background here."""
    store, tenant_id, response_id = await _stored(request)
    if await store.get(tenant_id, response_id) is None:
        raise _no_response(response_id)
    raise InvalidRequest(
        "Only background responses can be cancelled, and this one was not run in the "
        "background (none are here).",
        param="response_id",
    )


async def _stored(request: web.Request) -> tuple[ResponseStore, str, str]:
    """The store, the caller's tenant (its key checked first, as on every API route) and the
    id asked for; an id this edge cannot have given, or no store, is a 404 at once.

    Each call is one request of the key's and the tenant's limits (no tokens): reading stored
    conversations (up to 8 MiB each) costs Redis and this edge as much as a short completion,
    so a key may not do it faster than its rpm allows. Over the limit it is a 429 with the
    usual ``x-ratelimit-*`` and ``retry-after`` headers."""
    deps = request.app[DEPS]
    principal = await deps.auth.from_request(request)
    await _take_one_request(request, deps.limiter, principal)
    response_id = request.match_info["response_id"][:128]
    if deps.responses is None or not RESPONSE_ID.fullmatch(response_id):
        raise _no_response(response_id)
    return deps.responses, principal.tenant.tenant_id, response_id


async def _take_one_request(
    request: web.Request, limiter: RateLimiter, principal: Principal
) -> None:
    """Count one request against the caller's limits, released at once (it holds no stream
    while the handler runs: a read is not a generation). The limit headers go on the answer,
    a 429's included."""
    headers = request.setdefault(RESPONSE_HEADERS, {})
    try:
        lease = await limiter.admit(Ask(f"get_{uuid.uuid4().hex}", 0, scopes_for(principal)))
    except RateLimitExceeded as err:
        headers.update(err.headers)
        raise
    headers.update(lease.headers)
    limiter.settle(lease, 0)


def _no_response(response_id: str) -> NotFound:
    return NotFound(f"No response found with id '{response_id}'.", param="response_id")


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await request.app[EMBEDDINGS](_context(request, EMBEDDINGS_DIALECT.id_prefix))


async def _visible_models(request: web.Request) -> list[dict[str, object]]:
    """The models some healthy worker serves, as the caller's tenant may use them: only its
    ``allowed_models`` (when it has a list), each in its ``allowed_regions`` only (a model
    served nowhere the tenant may run is not listed) — what a request of theirs could reach.

    Each call is one request of the key's and the tenant's limits, as a stored-response read
    is (``_stored``): a key may not list faster than its rpm allows."""
    deps = request.app[DEPS]
    principal = await deps.auth.from_request(request)
    await _take_one_request(request, deps.limiter, principal)
    tenant = principal.tenant
    served = await deps.router.list_models()
    allowed = set(tenant.allowed_regions)
    out: list[dict[str, object]] = []
    for m in served.models:
        if not tenant.allows_model(m.name):
            continue
        regions = [r for r in m.regions if not allowed or r in allowed]
        if not regions:
            continue
        out.append(
            {
                "id": m.name,
                "object": "model",
                # When the model came up on the earliest worker serving it now (vLLM says the
                # time of the request; OpenAI the model's creation): stable while it serves.
                "created": m.created_unix_s,
                "owned_by": "meridian",
                "regions": regions,
                "max_model_len": m.max_model_len,
                # Meridian's extension (the SDK keeps unknown fields): what the model
                # supports somewhere in the fleet.
                "capabilities": capabilities.as_json(m.capabilities),
            }
        )
    return out


async def list_models(request: web.Request) -> web.Response:
    data = await _visible_models(request)
    return web.json_response({"object": "list", "data": data}, headers=request[RESPONSE_HEADERS])


async def retrieve_model(request: web.Request) -> web.Response:
    """GET /v1/models/{model} (the SDK's ``models.retrieve``): one entry of the list."""
    name = request.match_info["model"]
    for m in await _visible_models(request):
        if m["id"] == name:
            return web.json_response(m, headers=request[RESPONSE_HEADERS])
    raise ModelNotFound(f"The model '{name[:256]}' does not exist", param="model")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready when not draining, some model is servable (by the router, or by its last view
    while it is unreachable) and — with ``--redis-failure-mode closed`` only — Redis answers.

    In the default open mode an edge without Redis still serves the keys it has verified on
    local limits (the documented degraded mode), so it stays in its load balancer's rotation:
    a probe that failed here would take every edge out of service a few seconds into any
    Redis outage. The check is still reported, and the body says ``degraded``."""
    deps = request.app[DEPS]
    checks: dict[str, bool] = {}
    try:
        checks["redis"] = bool(await asyncio.wait_for(deps.redis.ping(), READY_REDIS_TIMEOUT_S))
    except REDIS_FAILURES:  # TimeoutError (wait_for) is an OSError
        checks["redis"] = False
    checks["router"] = await deps.router.ready()
    if deps.lifecycle.draining:
        return web.json_response({"status": "draining", "checks": checks}, status=503)
    redis_required = deps.limiter.config.failure_mode is FailureMode.CLOSED
    ok = checks["router"] and (checks["redis"] or not redis_required)
    body: dict[str, object] = {"status": "ready" if ok else "not ready", "checks": checks}
    if ok and not checks["redis"]:
        body["degraded"] = ["redis"]
    return web.json_response(body, status=200 if ok else 503)


READY_REDIS_TIMEOUT_S = 1.0
"""How long /readyz waits for Redis's PING: a probe must answer within its own timeout (one
second by default in Kubernetes) even while Redis hangs."""


def build_app(deps: EdgeDeps, web_state: WebState | None = None) -> web.Application:
    """The public app: the API routes and, with ``web_state``, the chat page and the console
    (services/edge/web/routes.py), beside them and off the chat path."""
    app = web.Application(
        middlewares=ordered_middlewares(
            {
                "telemetry": telemetry_middleware(deps.telemetry),
                "error_boundary": error_boundary,
                "ip_guard": ip_guard(buckets=deps.ip_buckets, counters=deps.counters),
            }
        ),
        client_max_size=deps.request_limits.max_body_bytes,
    )
    hide_version_banner(app)
    app[DEPS] = deps
    app[CHAT] = build_chat_pipeline(deps)
    app[COMPLETIONS] = build_completions_pipeline(deps)
    app[RESPONSES] = build_responses_pipeline(deps)
    app[EMBEDDINGS] = build_embeddings_pipeline(deps)
    app.router.add_post("/v1/chat/completions", chat_completions, expect_handler=expect_handler)
    app.router.add_post("/v1/completions", completions, expect_handler=expect_handler)
    app.router.add_post("/v1/responses", responses, expect_handler=expect_handler)
    one = "/v1/responses/{response_id}"
    app.router.add_get(one, stored_response, expect_handler=expect_handler)
    app.router.add_get(f"{one}/input_items", stored_input_items, expect_handler=expect_handler)
    app.router.add_delete(one, delete_stored_response, expect_handler=expect_handler)
    app.router.add_post(f"{one}/cancel", cancel_response, expect_handler=expect_handler)
    app.router.add_post("/v1/embeddings", embeddings, expect_handler=expect_handler)
    app.router.add_get("/v1/models", list_models, expect_handler=expect_handler)
    app.router.add_get(
        "/v1/models/{model:.+}", retrieve_model, expect_handler=expect_handler
    )  # ids may hold a "/"
    app.router.add_get("/healthz", healthz, expect_handler=expect_handler)
    app.router.add_get("/readyz", readyz, expect_handler=expect_handler)
    if web_state is not None:
        add_web_routes(app, web_state)
    return app
