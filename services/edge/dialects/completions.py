"""POST /v1/completions as the shared stages see it: raw prompts (text or token ids), no chat
template; what it needs of a worker (completions, echo, logprobs, suffix) goes to the router's
capability filter, so a feature no worker has is a 400 naming its field."""

from __future__ import annotations

from meridian.v1 import router_pb2
from services.common import limits
from services.common.capabilities import Needs
from services.common.errors import InvalidRequest
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.dialects.base import base_route_request, parse_body
from services.edge.openai_completions import CompletionRequest
from services.edge.openai_types import check_logit_bias
from services.edge.prompt import estimate_text_tokens, text_prefix_hashes
from services.edge.request_limits import RequestLimits


def completion_needs(body: CompletionRequest) -> Needs:
    return Needs(
        endpoint="completions",
        echo=body.echo,
        logprobs=body.logprobs or 0,
        suffix=bool(body.suffix),
    )


class CompletionsDialect:
    endpoint = "completions"
    id_prefix = "cmpl-"

    def __init__(self, *, max_prompts: int = limits.MAX_PROMPTS) -> None:
        self._max_prompts = max_prompts

    def accept(
        self, raw: bytes, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> str:
        try:
            body = parse_body(raw, CompletionRequest)
            check_logit_bias(body.logit_bias)
            prompts = body.prompts(self._max_prompts)
            _check_choices(body, len(prompts), limits)
            if body.stream_options is not None and not body.stream:
                raise InvalidRequest(
                    "stream_options is only allowed when stream is true", param="stream_options"
                )
        except InvalidRequest:
            counters.invalid_requests += 1
            raise
        chars = sum(len(p) for p in prompts if isinstance(p, str))
        if chars > limits.max_prompt_chars:
            counters.prompts_too_long += 1
            raise InvalidRequest(
                f"The prompt is {chars} characters long (at most {limits.max_prompt_chars}).",
                param="prompt",
                code="prompt_too_long",
            )
        ctx.completion = body
        ctx.prompts = prompts
        ctx.prompt_tokens_estimate = sum(estimate_text_tokens(p) for p in prompts)
        return body.model

    async def resolve(
        self, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> None:
        """Nothing to read: ``accept`` did it all."""

    def completion_budget(self, ctx: ChatContext) -> int | None:
        assert ctx.completion is not None
        return ctx.completion.worker_max_tokens()

    def choices(self, ctx: ChatContext) -> int:
        """Every prompt has ``n`` choices: max_tokens are reserved once per choice."""
        assert ctx.completion is not None
        return max(1, len(ctx.prompts)) * ctx.completion.choices()

    def route_request(
        self, ctx: ChatContext, *, site: str, exclude: tuple[str, ...] = ()
    ) -> router_pb2.RouteRequest:
        body = ctx.completion
        assert body is not None, "after validate"
        first = ctx.prompts[0] if ctx.prompts else ""
        return base_route_request(
            ctx,
            model=body.model,
            site=site,
            exclude=exclude,
            max_tokens=body.worker_max_tokens() or ctx.completion_cap or 0,
            prefix_hashes=text_prefix_hashes(first) if isinstance(first, str) else [],
            needs=completion_needs(body).to_pb(),
        )


COMPLETIONS = CompletionsDialect()


def _check_choices(body: CompletionRequest, prompts: int, request_limits: RequestLimits) -> None:
    """``n`` within the deployment's choices per request (as chat's), and prompts × n within
    :data:`~services.common.limits.MAX_COMPLETION_CHOICES`: each choice is a worker stream."""
    n = body.choices()
    if n > request_limits.max_choices:
        raise InvalidRequest(
            f"Invalid value for 'n': {n} is more than this deployment's "
            f"{request_limits.max_choices} choices per request.",
            param="n",
        )
    if prompts * n > limits.MAX_COMPLETION_CHOICES:
        raise InvalidRequest(
            f"Too many choices: {prompts} prompts × n {n} = {prompts * n} (at most "
            f"{limits.MAX_COMPLETION_CHOICES} in one request); send fewer prompts per request.",
            param="n",
        )
