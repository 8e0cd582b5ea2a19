"""The admit stage: reserve this request's share of its key's and tenant's limits, and settle
the reservation when the request ends — however it ends.

Reservation = the prompt's token estimate + the endpoint's completion budget (chat and
completions: ``max_tokens`` / ``max_completion_tokens``, or, if neither is set, the configured
``default_completion_tokens`` — but at least chat's ``min_tokens``, which the worker will
generate whatever the default says; embeddings: nothing, they decode no tokens), times the
choices asked (chat's ``n``, one per completions prompt). Under a token limit (a tpm on the
key or the tenant), a request that sets no max_tokens is sent to the worker with the default
as its max_tokens: it may not generate more than it reserved (finish_reason "length").

It is taken before routing, so a burst of concurrent requests cannot overrun a token limit:
each one must fit *with* every reservation still in flight.
When the response is over (completed, failed, or the client went away and the worker call was
cancelled), the reservation is replaced by the tokens the worker really reported
(``ctx.tokens_used``, kept current by the stream stage) and the stream slot is freed."""

from __future__ import annotations

from aiohttp import web

from services.edge.context import ChatContext
from services.edge.dialects.base import Dialect
from services.edge.dialects.chat import CHAT
from services.edge.pipeline import Next
from services.edge.ratelimit.limiter import RateLimiter, RateLimitExceeded
from services.edge.ratelimit.types import Ask, Scope
from services.edge.tenancy.auth import Principal


def scopes_for(principal: Principal) -> tuple[Scope, ...]:
    """The key's scope and its tenant's, under one hash tag (the tenant)."""
    tenant = principal.tenant.tenant_id
    key_id = principal.key.key_id
    return (
        Scope("key", key_id, f"{{{tenant}}}:k:{key_id}", principal.key_limits),
        Scope("tenant", tenant, f"{{{tenant}}}:t", principal.tenant.limits),
    )


def _has_token_limit(principal: Principal) -> bool:
    return principal.key_limits.tpm is not None or principal.tenant.limits.tpm is not None


class Admit:
    name = "admit"

    def __init__(self, *, limiter: RateLimiter, dialect: Dialect = CHAT) -> None:
        self._limiter = limiter
        self._dialect = dialect

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse:
        assert ctx.principal is not None
        completion = self._dialect.completion_budget(ctx)
        if completion is None:
            completion = self._limiter.config.default_completion_tokens
            # min_tokens (a vLLM extension) makes the worker generate at least that many:
            # reserve them, so a request over the tpm is refused as too large, as the same
            # max_tokens would be. (With max_tokens set, min_tokens is at most that.)
            if ctx.body is not None and ctx.body.min_tokens is not None:
                completion = max(completion, ctx.body.min_tokens)
            if _has_token_limit(ctx.principal):
                # What is reserved is what may be generated: without this cap a choice runs
                # to the model's context (8k, 128k tokens) on a reservation of the default,
                # and a tenant spends its tokens-per-minute many times over.
                ctx.completion_cap = completion
        completion *= self._dialect.choices(ctx)  # every choice may use max_tokens
        ask = Ask(
            ctx.request_id, ctx.prompt_tokens_estimate + completion, scopes_for(ctx.principal)
        )
        try:
            lease = await self._limiter.admit(ask)
        except RateLimitExceeded as err:
            ctx.headers.update(err.headers)
            raise
        ctx.lease = lease
        ctx.headers.update(lease.headers)
        try:
            return await call_next(ctx)
        finally:
            self._limiter.settle(lease, ctx.tokens_used)
