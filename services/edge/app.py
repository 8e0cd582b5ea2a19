"""The edge's aiohttp application: routes, the chat pipeline and the error boundary.

Dependencies (Redis, router client, worker pool, clock) are built by the caller and stored
under typed ``web.AppKey``s; nothing here reads globals or the environment.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis
import redis.exceptions
from aiohttp import web
from aiohttp.typedefs import Handler

from services.common.errors import (
    InternalError,
    InvalidRequest,
    MeridianError,
    NotFound,
    PayloadTooLarge,
)
from services.edge.apikeys import ApiKeyStore
from services.edge.context import ChatContext
from services.edge.failover import FailoverPolicy
from services.edge.pipeline import Next, build_chain
from services.edge.respond import Respond
from services.edge.stages import Authenticate, Route, Validate, authenticate
from services.edge.upstream import RouterClient, WorkerPool

log = logging.getLogger("meridian.edge")


@dataclass(frozen=True, slots=True)
class EdgeDeps:
    redis: aioredis.Redis
    keys: ApiKeyStore
    router: RouterClient
    workers: WorkerPool
    site: str
    policy: FailoverPolicy
    max_body_bytes: int = 4 * 1024 * 1024
    keepalive_after_s: float = 3.0


DEPS = web.AppKey("deps", EdgeDeps)
CHAT: web.AppKey[Next] = web.AppKey("chat_pipeline")
REQUEST_ID = web.RequestKey("request_id", str)


def error_response(err: MeridianError, request_id: str | None = None) -> web.Response:
    headers = {}
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(err.retry_after_s)))
    if request_id:
        headers["x-request-id"] = request_id
    return web.json_response(err.to_openai(), status=err.http_status, headers=headers)


@web.middleware
async def error_boundary(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves in OpenAI's error format; nothing leaks a stack trace."""
    try:
        return await handler(request)
    except MeridianError as err:
        return error_response(err, request.get(REQUEST_ID))
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[DEPS].max_body_bytes
        return error_response(PayloadTooLarge(f"request body is larger than {limit} bytes"))
    except web.HTTPNotFound:
        return error_response(NotFound(f"Unknown path: {request.method} {request.path}"))
    except web.HTTPMethodNotAllowed:
        return error_response(
            InvalidRequest(f"method {request.method} is not allowed on {request.path}"),
        )
    except web.HTTPException:
        raise
    except Exception:  # the boundary: log with trace, answer in the API's format
        log.exception("unhandled error", extra={"meridian_fields": {"path": request.path}})
        return error_response(InternalError("internal error"), request.get(REQUEST_ID))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    request[REQUEST_ID] = request_id
    ctx = ChatContext(request=request, request_id=request_id, headers={"x-request-id": request_id})
    return await request.app[CHAT](ctx)


async def list_models(request: web.Request) -> web.Response:
    deps = request.app[DEPS]
    await authenticate(deps.keys, request)
    served = await deps.router.list_models()
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": m.name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "meridian",
                    "regions": list(m.regions),
                    "max_model_len": m.max_model_len,
                }
                for m in served.models
            ],
        }
    )


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready when Redis answers and the router knows at least one servable model."""
    deps = request.app[DEPS]
    checks: dict[str, bool] = {}
    try:
        checks["redis"] = bool(await deps.redis.ping())
    except redis.exceptions.RedisError:
        checks["redis"] = False
    checks["router"] = await deps.router.ready()
    ok = all(checks.values())
    return web.json_response(
        {"status": "ready" if ok else "not ready", "checks": checks}, status=200 if ok else 503
    )


def build_app(deps: EdgeDeps) -> web.Application:
    app = web.Application(middlewares=[error_boundary], client_max_size=deps.max_body_bytes)
    app[DEPS] = deps
    app[CHAT] = build_chain(
        [
            Authenticate(keys=deps.keys),
            Validate(),
            Route(router=deps.router, site=deps.site),
        ],
        Respond(
            router=deps.router,
            workers=deps.workers,
            policy=deps.policy,
            keepalive_after_s=deps.keepalive_after_s,
        ),
    )
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
