"""The ``validate`` stage: read the body (bounded in size and time, decoded from its
``Content-Encoding`` by :mod:`services.edge.request_body`), parse it into the
endpoint's OpenAI request (its dialect: a 400 names the field), apply the request limits and
the tenant's model policy, and derive what later stages need without keeping the prompt (token
estimate, session id)."""

from __future__ import annotations

import asyncio
import hashlib
import re

from aiohttp import web

from services.common.errors import InvalidRequest, ModelNotFound, PayloadTooLarge
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.dialects.base import Dialect
from services.edge.dialects.chat import CHAT
from services.edge.httperrors import RequestTimeout, UnsupportedCharset
from services.edge.offload import OFF_LOOP_BYTES, off_loop
from services.edge.pipeline import Next
from services.edge.request_body import content_coding, decode_body
from services.edge.request_limits import RequestLimits

__all__ = ["RequestLimits", "Validate", "cache_key_session", "session_id"]

#: Bodies bigger than this are parsed in the offload thread (services/edge/offload.py), not
#: on the event loop: parsing and checking a few megabytes of tool schemas is pure Python for
#: a second or more, and every other stream of this process would stall for as long.
PARSE_OFF_LOOP_BYTES = OFF_LOOP_BYTES


class Validate:
    """Read the body (bounded in size and time), parse it, apply the request limits and the
    tenant's model policy."""

    name = "validate"

    def __init__(
        self,
        *,
        limits: RequestLimits,
        body_timeout_s: float,
        counters: EdgeCounters,
        dialect: Dialect = CHAT,
    ) -> None:
        self._dialect = dialect
        self._limits = limits
        self._body_timeout_s = body_timeout_s
        self._counters = counters

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse:
        raw = await self._read(ctx.request)
        if len(raw) > PARSE_OFF_LOOP_BYTES:
            model = await self._accept_off_loop(raw, ctx)
        else:
            model = self._dialect.accept(raw, ctx, self._limits, self._counters)
        assert ctx.principal is not None
        await self._dialect.resolve(ctx, self._limits, self._counters)
        if not ctx.principal.tenant.allows_model(model):
            self._counters.models_not_allowed += 1
            # As OpenAI: do not reveal whether the model exists to someone not allowed it.
            raise ModelNotFound(
                f"The model `{model}` does not exist or you do not have access to it.",
                param="model",
            )
        ctx.model = model
        ctx.session_id = session_id(ctx.request) or cache_key_session(ctx)
        return await call_next(ctx)

    async def _accept_off_loop(self, raw: bytes, ctx: ChatContext) -> str:
        counted = EdgeCounters()
        try:
            return await off_loop(self._dialect.accept, raw, ctx, self._limits, counted)
        finally:
            self._counters.add(counted)

    async def _read(self, request: web.Request) -> bytes:
        coding = content_coding(request)  # 415 before waiting for a body it cannot decode
        charset = request.charset
        if charset is not None and charset.lower() not in ("utf-8", "utf8"):
            # JSON is UTF-8 (RFC 8259); a UTF-16 body would fail as "not valid UTF-8".
            raise UnsupportedCharset(
                f"unsupported charset {charset[:40]!r} in Content-Type; send UTF-8 JSON",
                param="Content-Type",
            )
        declared = request.content_length
        if declared is not None and declared > self._limits.max_body_bytes:
            # Refused before a byte is read: reading up to the limit first let a client that
            # declared too much, then sent little, hold the request until the body timeout.
            self._counters.bodies_too_large += 1
            if request.transport is not None:
                request.protocol.close()  # after this answer: the body is not wanted
            raise PayloadTooLarge(
                f"request body is larger than {self._limits.max_body_bytes} bytes"
            )
        try:
            raw = await asyncio.wait_for(request.read(), self._body_timeout_s)
        except TimeoutError:
            self._counters.body_timeouts += 1
            if request.transport is not None:
                request.protocol.close()  # the rest of the body is not worth waiting for
            raise RequestTimeout(
                f"The request body did not arrive within {self._body_timeout_s:g}s."
            ) from None
        except web.HTTPRequestEntityTooLarge:
            self._counters.bodies_too_large += 1
            raise PayloadTooLarge(
                f"request body is larger than {self._limits.max_body_bytes} bytes"
            ) from None
        try:
            return decode_body(raw, coding, max_bytes=self._limits.max_body_bytes)
        except PayloadTooLarge:
            self._counters.bodies_too_large += 1
            raise


_SESSION_RE = re.compile(r"^[\x20-\x7e]*$")
MAX_SESSION_ID = 128


def cache_key_session(ctx: ChatContext) -> str:
    """The session a chat request's ``prompt_cache_key`` names, or "": a digest of the tenant
    and the key, so two tenants' keys never share a session (``"default"`` is a likely key)
    and any key, up to 1,024 characters, is 36 ASCII characters to the router."""
    key = ctx.body.prompt_cache_key if ctx.body is not None else None
    if not key or ctx.principal is None:
        return ""
    tenant = ctx.principal.tenant.tenant_id
    digest = hashlib.sha256(f"{tenant}\0{key}".encode(errors="surrogatepass")).hexdigest()
    return f"pck-{digest[:32]}"


def session_id(request: web.Request) -> str:
    """``x-session-id`` (its first 128 characters), if it is printable ASCII; else 400."""
    value = request.headers.get("x-session-id", "")[:MAX_SESSION_ID]
    if not _SESSION_RE.fullmatch(value):
        raise InvalidRequest(
            "x-session-id must be printable ASCII", param="x-session-id", code="invalid_header"
        )
    return value
