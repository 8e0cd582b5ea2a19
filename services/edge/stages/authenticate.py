"""The ``authenticate`` stage: ``Authorization: Bearer mk-…`` → the caller's
:class:`~services.edge.tenancy.auth.Principal` (key + tenant), or 401."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from services.edge.context import ChatContext
from services.edge.pipeline import Next
from services.edge.tenancy.auth import Authenticator


class Authenticate:
    """``Authorization: Bearer mk-…`` → the key's :class:`~services.edge.tenancy.auth.Principal`."""

    name = "authenticate"

    def __init__(
        self, *, auth: Authenticator, expiring: Callable[[str, int], None] | None = None
    ) -> None:
        self._auth = auth
        #: Told of a key that stops working at a set time (digest, epoch ms), so a request
        #: running under it can end then (services/edge/tenancy/revocation.py).
        self._expiring = expiring

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse:
        ctx.principal = principal = await self._auth.from_request(ctx.request)
        if ctx.in_flight is not None:  # what a revocation while it runs is matched against
            ctx.in_flight.key_digest = principal.digest
            ctx.in_flight.tenant_id = principal.tenant.tenant_id
            expires_ms = principal.key.expires_ms
            if expires_ms is not None and self._expiring is not None:
                self._expiring(principal.digest, expires_ms)
        return await call_next(ctx)
