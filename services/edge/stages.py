"""The chat pipeline's non-terminal stages: authenticate, validate, route.

Each is a small class built with its dependencies (keyword-only), so tests assemble real
stages around real Redis and real gRPC servers. See :mod:`services.edge.pipeline` for the order.
"""

from __future__ import annotations

import logging

import redis.exceptions
from aiohttp import web

from meridian.v1 import router_pb2
from services.common.errors import AuthenticationFailed, Unavailable
from services.common.logs import event
from services.edge.apikeys import ApiKeyStore, KeyRecord, looks_like_key
from services.edge.context import ChatContext
from services.edge.openai_types import parse_chat_request
from services.edge.pipeline import Next
from services.edge.prompt import estimate_prompt_tokens, prefix_hashes
from services.edge.upstream import RouterClient

log = logging.getLogger("meridian.edge")

_NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


def bearer_token(request: web.Request) -> str:
    """The key from ``Authorization: Bearer <key>``; raises if absent or malformed."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if not header or scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed(_NO_KEY, code=None)
    return token.strip()


class Authenticate:
    """``Authorization: Bearer mk-…`` → the key's tenant. Wrong format is refused before any
    lookup; the lookup is by hash (see :mod:`services.edge.apikeys`)."""

    name = "authenticate"

    def __init__(self, *, keys: ApiKeyStore) -> None:
        self._keys = keys

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse:
        ctx.key = await authenticate(self._keys, ctx.request)
        return await call_next(ctx)


async def authenticate(keys: ApiKeyStore, request: web.Request) -> KeyRecord:
    raw = bearer_token(request)
    if not looks_like_key(raw):
        raise AuthenticationFailed(
            "Incorrect API key provided: the key is not in Meridian's format."
        )
    try:
        record = await keys.verify(raw)
    except redis.exceptions.RedisError as err:
        event(log, "auth.redis_error", level=logging.WARNING, error=type(err).__name__)
        raise Unavailable("authentication is temporarily unavailable", retry_after_s=1.0) from None
    if record is None:
        raise AuthenticationFailed("Incorrect API key provided.")
    return record


class Validate:
    """Parse and validate the JSON body (size already bounded by the server)."""

    name = "validate"

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse:
        raw = await ctx.request.read()
        ctx.body = parse_chat_request(raw)
        ctx.prompt_tokens_estimate = estimate_prompt_tokens(ctx.body)
        return await call_next(ctx)


class Route:
    """Ask the router for a ranked list of workers for this request."""

    name = "route"

    def __init__(self, *, router: RouterClient, site: str) -> None:
        self._router = router
        self._site = site

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse:
        body = ctx.body
        assert body is not None and ctx.key is not None
        req = router_pb2.RouteRequest(
            request_id=ctx.request_id,
            model=body.model,
            tenant_id=ctx.key.tenant,
            priority=router_pb2.PRIORITY_STANDARD,
            edge_site=self._site,
            prompt_tokens=ctx.prompt_tokens_estimate,
            max_tokens=body.effective_max_tokens() or 0,
            session_id=ctx.request.headers.get("x-session-id", "")[:128],
            prefix_hashes=prefix_hashes(body),
        )
        ctx.route_request = req
        ctx.route = await self._router.route(req)
        return await call_next(ctx)
