"""The ``route`` stage: ask the router (or, while it is unreachable, its last view) for ranked
workers, and hand the stream stage a ``reroute`` for asking again."""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from services.edge.context import ChatContext
from services.edge.dialects.base import Dialect
from services.edge.dialects.chat import CHAT
from services.edge.pipeline import Next
from services.edge.upstream.router_client import RouteResult, RouterLike


class Route:
    """Ask the router (or, if it is unreachable, the last known view) for ranked workers."""

    name = "route"

    def __init__(self, *, router: RouterLike, site: str, dialect: Dialect = CHAT) -> None:
        self._router = router
        self._site = site
        self._dialect = dialect

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse:
        router, site, dialect = self._router, self._site, self._dialect

        async def reroute(exclude: Sequence[str]) -> RouteResult:
            return await router.route(dialect.route_request(ctx, site=site, exclude=tuple(exclude)))

        ctx.route = await router.route(dialect.route_request(ctx, site=site))
        ctx.reroute = reroute
        return await call_next(ctx)
