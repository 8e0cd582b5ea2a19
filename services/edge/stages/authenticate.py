"""The ``authenticate`` stage: ``Authorization: Bearer mk-…`` → the caller's
:class:`~services.edge.tenancy.auth.Principal` (key + tenant), or 401."""

from __future__ import annotations

from aiohttp import web

from services.edge.context import ChatContext
from services.edge.pipeline import Next
from services.edge.tenancy.auth import Authenticator


class Authenticate:
    """``Authorization: Bearer mk-…`` → the key's :class:`~services.edge.tenancy.auth.Principal`."""

    name = "authenticate"

    def __init__(self, *, auth: Authenticator) -> None:
        self._auth = auth

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse:
        ctx.principal = await self._auth.from_request(ctx.request)
        return await call_next(ctx)
