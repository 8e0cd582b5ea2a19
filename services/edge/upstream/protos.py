"""The two upstream requests of one chat request, built in one place, always fresh.

``route_request`` is what the router ranks workers by; ``generate_request`` is what a worker
runs. Both are pure functions of the request context (and of what the caller asks to vary:
the workers to exclude, the attempt's id and decision), so no stage edits another stage's
proto and a retry never inherits a field an earlier attempt set.

The prompt goes only into ``generate_request``; the router sees its token estimate and prefix
hashes (services/edge/prompt.py), never its text.
"""

from __future__ import annotations

from collections.abc import Sequence

from meridian.v1 import router_pb2, worker_pb2
from services.edge.context import ChatContext


def route_request(
    ctx: ChatContext, *, site: str, exclude: Sequence[str] = ()
) -> router_pb2.RouteRequest:
    """Where can this chat request run? ``exclude``: workers already tried. (The chat
    dialect's, services/edge/dialects/chat.py, which every endpoint's dialect mirrors.)"""
    from services.edge.dialects.chat import CHAT

    return CHAT.route_request(ctx, site=site, exclude=tuple(exclude))


def generate_request(
    ctx: ChatContext, *, request_id: str, decision_id: str
) -> worker_pb2.GenerateRequest:
    """What one attempt asks a worker to run: the messages and the sampling options, under
    the attempt's own ``request_id`` (the worker aborts by it) and the router's
    ``decision_id`` (the worker echoes it in load reports)."""
    body = ctx.body
    assert body is not None and ctx.principal is not None, "after authenticate and validate"
    tenant = ctx.principal.tenant
    req = worker_pb2.GenerateRequest(
        request_id=request_id,
        decision_id=decision_id,
        model=body.model,
        tenant_id=tenant.tenant_id,
        priority=tenant.tier.priority(),
    )
    for m in body.messages:
        req.messages.add(role=m.role, content=m.text(), name=m.name or "")
    s = req.sampling
    if body.temperature is not None:
        s.temperature = body.temperature
    if body.top_p is not None:
        s.top_p = body.top_p
    max_tokens = body.effective_max_tokens()
    if max_tokens is not None:
        s.max_tokens = max_tokens
    s.stop.extend(body.stop_list())
    if body.seed is not None:
        s.seed = body.seed
    if body.presence_penalty is not None:
        s.presence_penalty = body.presence_penalty
    if body.frequency_penalty is not None:
        s.frequency_penalty = body.frequency_penalty
    s.logprobs = bool(body.logprobs)
    s.top_logprobs = body.top_logprobs or 0
    s.ignore_eos = body.ignore_eos
    return req
