"""POST /v1/chat/completions as the shared stages see it (parse, budget, route request)."""

from __future__ import annotations

from meridian.v1 import router_pb2
from services.common import grpcutil
from services.common.capabilities import Needs
from services.common.errors import InvalidRequest, PayloadTooLarge
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.dialects.base import base_route_request
from services.edge.openai_types import ChatCompletionRequest, parse_chat_request
from services.edge.prompt import estimate_prompt_tokens, prefix_hashes
from services.edge.request_limits import RequestLimits

#: What a Generate request may take of one gRPC message: the rest is for the MuxOpen around
#: it (ids, metadata). A bigger one would break the GenerateMux call every stream to that
#: worker shares (and then the next worker's, on retry).
MAX_GENERATE_BYTES = grpcutil.MAX_MESSAGE_BYTES - 64 * 1024
#: Bodies up to this size cannot encode past it: a JSON byte grows at most ~5.5× as a
#: protobuf Struct (``0,`` → an 11-byte Value), so only bigger bodies are encoded to check.
_CHECK_ENCODED_ABOVE_BYTES = grpcutil.MAX_MESSAGE_BYTES // 8


def chat_needs(body: ChatCompletionRequest) -> Needs:
    """What a chat request needs of a worker (the router's ``capability`` filter): tools when
    tools may be called (a parser on the worker), structured outputs for a JSON response
    format or a forced tool choice (``required`` / a named function), and ``n`` choices."""
    forced = body.uses_tools() and body.tool_choice_mode() in ("required", "function")
    return Needs(
        endpoint="chat",
        logprobs=body.top_logprobs or 0 if body.logprobs else 0,
        tools=body.uses_tools(),
        structured_outputs=body.response_format_type() != "text" or forced,
        n=body.choices(),
    )


class ChatDialect:
    endpoint = "chat"
    id_prefix = "chatcmpl-"

    def accept(
        self, raw: bytes, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> str:
        try:
            body = parse_chat_request(raw)
        except InvalidRequest:
            counters.invalid_requests += 1
            raise
        return self.accept_body(body, len(raw), ctx, limits, counters)

    def accept_body(
        self,
        body: ChatCompletionRequest,
        raw_bytes: int,
        ctx: ChatContext,
        limits: RequestLimits,
        counters: EdgeCounters,
    ) -> str:
        """The deployment's bounds on a validated chat request (messages, choices, prompt
        size, its encoded size); then it is the context's body. ``raw_bytes``: the size of
        the body it came from."""
        if len(body.messages) > limits.max_messages:
            counters.too_many_messages += 1
            raise InvalidRequest(
                f"Too many messages: {len(body.messages)} (at most {limits.max_messages}).",
                param="messages",
            )
        if body.choices() > limits.max_choices:
            counters.invalid_requests += 1
            raise InvalidRequest(
                f"Invalid value for 'n': {body.n} is more than this deployment's "
                f"{limits.max_choices} choices per request.",
                param="n",
            )
        chars = sum(len(m.text()) for m in body.messages)
        if chars > limits.max_prompt_chars:
            counters.prompts_too_long += 1
            raise InvalidRequest(
                f"The messages are {chars} characters long (at most {limits.max_prompt_chars}).",
                param="messages",
                code="prompt_too_long",
            )
        ctx.body = body
        ctx.prompt_tokens_estimate = estimate_prompt_tokens(body)
        if raw_bytes > _CHECK_ENCODED_ABOVE_BYTES:
            _check_encoded_size(ctx, counters)
        return body.model

    async def resolve(
        self, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> None:
        """Nothing to read: ``accept`` did it all."""

    def completion_budget(self, ctx: ChatContext) -> int | None:
        assert ctx.body is not None
        return ctx.body.effective_max_tokens()

    def choices(self, ctx: ChatContext) -> int:
        assert ctx.body is not None
        return ctx.body.choices()

    def route_request(
        self, ctx: ChatContext, *, site: str, exclude: tuple[str, ...] = ()
    ) -> router_pb2.RouteRequest:
        body = ctx.body
        assert body is not None, "after validate"
        return base_route_request(
            ctx,
            model=body.model,
            site=site,
            exclude=exclude,
            max_tokens=(body.effective_max_tokens() or ctx.completion_cap or 0) * body.choices(),
            prefix_hashes=prefix_hashes(body),
            needs=chat_needs(body).to_pb(),
        )


CHAT = ChatDialect()


def _check_encoded_size(ctx: ChatContext, counters: EdgeCounters) -> None:
    """A 413 naming the largest part when the request, as a worker receives it, would not
    fit in one gRPC message (a tool's ``enum`` of 600,000 zeros is 1.2 MB of JSON and
    6.6 MB of Struct). The encoded content is kept for the attempts (``ctx.chat_payload``):
    encoding it again for each would cost as much again, on the event loop."""
    from services.edge.upstream.protos import chat_payload

    assert ctx.body is not None
    req = chat_payload(ctx.body)
    # The per-attempt fields (ids, sampling) are small: the margin in MAX_GENERATE_BYTES.
    size = req.ByteSize()
    if size <= MAX_GENERATE_BYTES:
        ctx.chat_payload = req
        return
    counters.invalid_requests += 1
    parts = {"messages": sum(m.ByteSize() for m in req.messages)}
    parts.update({f"tools[{i}].function.parameters": t.ByteSize() for i, t in enumerate(req.tools)})
    parts["response_format"] = req.response_format.ByteSize()
    param = max(parts, key=lambda k: parts[k])
    raise PayloadTooLarge(
        f"The request is {size:,} bytes once encoded for a worker (at most "
        f"{MAX_GENERATE_BYTES:,}); '{param}' takes {parts[param]:,} of them.",
        param=param,
    )
