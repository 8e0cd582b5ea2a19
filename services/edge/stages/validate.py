"""The ``validate`` stage: read the body (bounded in size and time), parse it into an OpenAI
chat request (a 400 names the field), apply the request limits and the tenant's model policy,
and derive what later stages need without keeping the prompt (token estimate, session id)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from aiohttp import web

from services.common.errors import InvalidRequest, ModelNotFound, PayloadTooLarge
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.httperrors import RequestTimeout
from services.edge.openai_types import HARD_MAX_N, parse_chat_request
from services.edge.pipeline import Next
from services.edge.prompt import estimate_prompt_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestLimits:
    """What one request may carry, whoever sends it (tenant policy comes on top)."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 512
    max_prompt_chars: int = 1_000_000
    max_choices: int = 16  # n

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")
        if not 1 <= self.max_choices <= HARD_MAX_N:
            raise ValueError(f"max_choices must be in 1..{HARD_MAX_N}")
        if self.max_messages < 1 or self.max_prompt_chars < 1:
            raise ValueError("max_messages and max_prompt_chars must be >= 1")


class Validate:
    """Read the body (bounded in size and time), parse it, apply the request limits and the
    tenant's model policy."""

    name = "validate"

    def __init__(
        self, *, limits: RequestLimits, body_timeout_s: float, counters: EdgeCounters
    ) -> None:
        self._limits = limits
        self._body_timeout_s = body_timeout_s
        self._counters = counters

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse:
        raw = await self._read(ctx.request)
        try:
            body = parse_chat_request(raw)
        except InvalidRequest:
            self._counters.invalid_requests += 1
            raise
        limits = self._limits
        if len(body.messages) > limits.max_messages:
            self._counters.too_many_messages += 1
            raise InvalidRequest(
                f"Too many messages: {len(body.messages)} (at most {limits.max_messages}).",
                param="messages",
            )
        if body.choices() > limits.max_choices:
            self._counters.invalid_requests += 1
            raise InvalidRequest(
                f"Invalid value for 'n': {body.n} is more than this deployment's "
                f"{limits.max_choices} choices per request.",
                param="n",
            )
        chars = sum(len(m.text()) for m in body.messages)
        if chars > limits.max_prompt_chars:
            self._counters.prompts_too_long += 1
            raise InvalidRequest(
                f"The messages are {chars} characters long (at most {limits.max_prompt_chars}).",
                param="messages",
                code="prompt_too_long",
            )
        assert ctx.principal is not None
        if not ctx.principal.tenant.allows_model(body.model):
            self._counters.models_not_allowed += 1
            # As OpenAI: do not reveal whether the model exists to someone not allowed it.
            raise ModelNotFound(
                f"The model `{body.model}` does not exist or you do not have access to it.",
                param="model",
            )
        ctx.body = body
        ctx.prompt_tokens_estimate = estimate_prompt_tokens(body)
        ctx.session_id = session_id(ctx.request)
        return await call_next(ctx)

    async def _read(self, request: web.Request) -> bytes:
        try:
            return await asyncio.wait_for(request.read(), self._body_timeout_s)
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


_SESSION_RE = re.compile(r"^[\x20-\x7e]*$")
MAX_SESSION_ID = 128


def session_id(request: web.Request) -> str:
    """``x-session-id`` (its first 128 characters), if it is printable ASCII; else 400."""
    value = request.headers.get("x-session-id", "")[:MAX_SESSION_ID]
    if not _SESSION_RE.match(value):
        raise InvalidRequest(
            "x-session-id must be printable ASCII", param="x-session-id", code="invalid_header"
        )
    return value
