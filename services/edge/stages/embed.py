"""The ``embed`` stage of POST /v1/embeddings, terminal: one Embed call (with failover,
:mod:`services.edge.upstream.embed`), answered as OpenAI's embeddings list in ``float`` or
``base64`` encoding. ``ctx.tokens_used`` becomes the input tokens the worker counted, so the
admit stage settles the reservation with them (an embedding decodes nothing)."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from meridian.v1 import worker_pb2
from services.common.logs import event
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.observability import EdgeTelemetry
from services.edge.offload import json_answer
from services.edge.render_embedding import embeddings_body
from services.edge.upstream.embed import embed_with_failover
from services.edge.upstream.failover import FailoverPolicy, OutcomeSink
from services.edge.upstream.worker_pool import WorkerPool

log = logging.getLogger("meridian.edge")


def embed_request(
    ctx: ChatContext, *, request_id: str, decision_id: str
) -> worker_pb2.EmbedRequest:
    body = ctx.embedding
    assert body is not None and ctx.principal is not None, "after authenticate and validate"
    tenant = ctx.principal.tenant
    req = worker_pb2.EmbedRequest(
        request_id=request_id,
        decision_id=decision_id,
        model=body.model,
        tenant_id=tenant.tenant_id,
        priority=tenant.tier.priority(),
        dimensions=body.dimensions or 0,
    )
    for item in ctx.prompts:
        if isinstance(item, str):
            req.inputs.add(text=item)
        else:
            req.inputs.add(token_ids=item)
    return req


class Embed:
    name = "embed"

    def __init__(
        self,
        *,
        router: OutcomeSink,
        workers: WorkerPool,
        policy: FailoverPolicy,
        counters: EdgeCounters,
        telemetry: EdgeTelemetry,
    ) -> None:
        self._router = router
        self._workers = workers
        self._policy = policy
        self._counters = counters
        self._telemetry = telemetry

    async def __call__(self, ctx: ChatContext) -> web.StreamResponse:
        body = ctx.embedding
        assert body is not None and ctx.route is not None and ctx.reroute is not None

        def build(request_id: str, decision_id: str) -> worker_pb2.EmbedRequest:
            return embed_request(ctx, request_id=request_id, decision_id=decision_id)

        done = await embed_with_failover(
            first_route=ctx.route,
            reroute=ctx.reroute,
            outcomes=self._router,
            workers=self._workers,
            request_id=ctx.request_id,
            build=build,
            policy=self._policy,
            tracer=self._telemetry.tracer,
        )
        resp = done.response
        tokens = resp.usage.prompt_tokens
        ctx.tokens_used = tokens
        self._counters.embeddings += 1
        self._telemetry.record_embedding(
            model=body.model,
            region=done.candidate.region,
            started=ctx.started,
            prompt_tokens=tokens,
            attempts=done.attempts,
        )
        event(
            log,
            "embeddings.completed",
            request_id=ctx.request_id,
            tenant=ctx.principal.tenant.tenant_id if ctx.principal else "",
            key_id=ctx.principal.key.key_id if ctx.principal else "",
            worker_id=done.candidate.worker_id,
            region=done.candidate.region,
            attempts=done.attempts,
            inputs=len(resp.embeddings),
            prompt_tokens=tokens,
            duration_ms=round((time.monotonic() - ctx.started) * 1000, 2),
        )
        return await json_answer(
            lambda: embeddings_body(
                model=body.model, response=resp, encoding_format=body.encoding_format
            ),
            items=sum(len(e.values) for e in resp.embeddings),
            headers={
                **ctx.headers,
                "x-meridian-region": done.candidate.region,
                "x-meridian-worker": done.candidate.worker_id,
                "x-meridian-attempts": str(done.attempts),
            },
        )
