"""POST /v1/embeddings as the shared stages see it: inputs bounded in count and length (a bad
one is named ``input[3]``), no completion budget (an embedding decodes nothing, so only its
input tokens count against the limits), and a route request that needs a pooling model (and
``dimensions``, where asked)."""

from __future__ import annotations

from meridian.v1 import router_pb2
from services.common.capabilities import Needs
from services.common.errors import InvalidRequest
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.dialects.base import base_route_request, parse_body
from services.edge.openai_completions import EmbeddingRequest, checked_inputs
from services.edge.prompt import estimate_text_tokens
from services.edge.request_limits import RequestLimits


class EmbeddingsDialect:
    endpoint = "embeddings"
    id_prefix = "embd-"

    def accept(
        self, raw: bytes, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> str:
        try:
            body = parse_body(raw, EmbeddingRequest)
            inputs = checked_inputs(
                body.input,
                "input",
                max_items=limits.max_embedding_inputs,
                max_chars=limits.max_input_chars,
            )
        except InvalidRequest:
            counters.invalid_requests += 1
            raise
        ctx.embedding = body
        ctx.prompts = inputs
        ctx.prompt_tokens_estimate = sum(estimate_text_tokens(x) for x in inputs)
        return body.model

    async def resolve(
        self, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> None:
        """Nothing to read: ``accept`` did it all."""

    def completion_budget(self, ctx: ChatContext) -> int | None:
        return 0

    def choices(self, ctx: ChatContext) -> int:
        return 1

    def route_request(
        self, ctx: ChatContext, *, site: str, exclude: tuple[str, ...] = ()
    ) -> router_pb2.RouteRequest:
        body = ctx.embedding
        assert body is not None, "after validate"
        needs = Needs(endpoint="embeddings", embedding_dimensions=body.dimensions or 0)
        return base_route_request(
            ctx,
            model=body.model,
            site=site,
            exclude=exclude,
            max_tokens=0,
            prefix_hashes=[],
            needs=needs.to_pb(),
        )


EMBEDDINGS = EmbeddingsDialect()
