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
from services.common.jsonstruct import to_struct
from services.edge.context import ChatContext
from services.edge.openai_completions import CompletionRequest
from services.edge.openai_types import (
    ChatCompletionRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    NamedToolChoice,
    logit_bias_pairs,
)


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
    assert body is not None, "after validate"
    req = _new_request(ctx, body.model, request_id=request_id, decision_id=decision_id)
    if ctx.chat_payload is not None:
        req.MergeFrom(ctx.chat_payload)  # a large request's, built once (see chat_payload)
    else:
        _add_payload(body, req)
    s = req.sampling
    _add_common_sampling(body, s, max_tokens=body.effective_max_tokens() or ctx.completion_cap)
    s.logprobs = bool(body.logprobs)
    s.top_logprobs = body.top_logprobs or 0
    s.ignore_eos = body.ignore_eos
    if body.n is not None and body.n > 1:
        req.n = body.n
    _add_sampling_extensions(body, s)
    return req


def chat_payload(body: ChatCompletionRequest) -> worker_pb2.GenerateRequest:
    """The part of every attempt's Generate request that is the client's content: messages,
    tools and response format, nothing per attempt. A large request's is built once, off the
    event loop, and merged into each attempt: the Struct of a megabyte of tool schemas takes
    the better part of a second of pure Python to build."""
    req = worker_pb2.GenerateRequest()
    _add_payload(body, req)
    return req


def _add_payload(body: ChatCompletionRequest, req: worker_pb2.GenerateRequest) -> None:
    req.truncate_oldest = body.truncation == "auto"
    for m in body.messages:
        msg = req.messages.add(role=m.role, content=m.text(), name=m.name or "")
        if m.tool_calls:
            for call in m.tool_calls:
                msg.tool_calls.add(
                    id=call.id,
                    type="function",
                    name=call.function.name,
                    arguments=call.function.arguments,
                )
        if m.tool_call_id:
            msg.tool_call_id = m.tool_call_id
    if body.tools or body.response_format is not None:
        _add_tools_and_format(body, req)


def completion_request(
    ctx: ChatContext,
    prompt: str | list[int],
    *,
    request_id: str,
    decision_id: str,
    choice: int = 0,
) -> worker_pb2.GenerateRequest:
    """One choice's Generate request for POST /v1/completions: the raw prompt (no chat
    template), echo and the sampling options. Choice *j* of a prompt (``n`` > 1) is its own
    request; with a ``seed`` it samples with ``seed + j``, as vLLM seeds its ``n`` children,
    so the choices differ and each is reproducible."""
    body = ctx.completion
    assert body is not None, "after validate"
    req = _new_request(ctx, body.model, request_id=request_id, decision_id=decision_id)
    req.echo = body.echo
    if isinstance(prompt, str):
        req.raw_prompt.text = prompt
    else:
        req.raw_prompt.token_ids.extend(prompt)
    s = req.sampling
    _add_common_sampling(body, s, max_tokens=body.worker_max_tokens() or ctx.completion_cap)
    if body.seed is not None and choice:
        s.seed = _wrapped_seed(body.seed + choice)
    s.logprobs = body.logprobs is not None
    s.top_logprobs = body.logprobs or 0
    s.ignore_eos = body.ignore_eos
    for token, bias in logit_bias_pairs(body.logit_bias):
        s.logit_bias[token] = bias
    return req


def _wrapped_seed(seed: int) -> int:
    """A seed past int64's top wraps around (``seed + j`` of a seed near 2**63)."""
    return (seed + 2**63) % 2**64 - 2**63


def _new_request(
    ctx: ChatContext, model: str, *, request_id: str, decision_id: str
) -> worker_pb2.GenerateRequest:
    """The head every Generate request carries: ids, model, who asks and at what priority."""
    assert ctx.principal is not None, "after authenticate"
    tenant = ctx.principal.tenant
    return worker_pb2.GenerateRequest(
        request_id=request_id,
        decision_id=decision_id,
        model=model,
        tenant_id=tenant.tenant_id,
        priority=tenant.tier.priority(),
    )


def _add_common_sampling(
    body: ChatCompletionRequest | CompletionRequest,
    s: worker_pb2.SamplingParams,
    *,
    max_tokens: int | None,
) -> None:
    """The OpenAI sampling fields chat and completions share."""
    if body.temperature is not None:
        s.temperature = body.temperature
    if body.top_p is not None:
        s.top_p = body.top_p
    if max_tokens is not None:
        s.max_tokens = max_tokens
    s.stop.extend(body.stop_list())
    if body.seed is not None:
        s.seed = body.seed
    if body.presence_penalty is not None:
        s.presence_penalty = body.presence_penalty
    if body.frequency_penalty is not None:
        s.frequency_penalty = body.frequency_penalty


def _add_sampling_extensions(body: ChatCompletionRequest, s: worker_pb2.SamplingParams) -> None:
    if body.top_k is not None:
        s.top_k = body.top_k
    if body.min_p is not None:
        s.min_p = body.min_p
    if body.repetition_penalty is not None:
        s.repetition_penalty = body.repetition_penalty
    if body.min_tokens is not None:
        s.min_tokens = body.min_tokens
    if body.stop_token_ids:
        s.stop_token_ids.extend(body.stop_token_ids)
    for token, bias in body.logit_bias_pairs():
        s.logit_bias[token] = bias


_TOOL_CHOICE_MODES = {
    "auto": worker_pb2.ToolChoice.TOOL_CHOICE_MODE_AUTO,
    "none": worker_pb2.ToolChoice.TOOL_CHOICE_MODE_NONE,
    "required": worker_pb2.ToolChoice.TOOL_CHOICE_MODE_REQUIRED,
    "function": worker_pb2.ToolChoice.TOOL_CHOICE_MODE_FUNCTION,
}


def _add_tools_and_format(body: ChatCompletionRequest, req: worker_pb2.GenerateRequest) -> None:
    for tool in body.tools or ():
        fn = tool.function
        spec = req.tools.add(type="function")
        spec.function.name = fn.name
        spec.function.description = fn.description or ""
        spec.function.strict = bool(fn.strict)
        if fn.parameters is not None:
            to_struct(fn.parameters, spec.function.parameters)
    if body.tools:
        req.tool_choice.mode = _TOOL_CHOICE_MODES[body.tool_choice_mode()]
        if isinstance(body.tool_choice, NamedToolChoice):
            req.tool_choice.function_name = body.tool_choice.function.name
        if body.parallel_tool_calls is not None:
            req.parallel_tool_calls = body.parallel_tool_calls
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        req.response_format.type = worker_pb2.ResponseFormat.RESPONSE_FORMAT_TYPE_JSON_OBJECT
    elif isinstance(fmt, JsonSchemaFormat):
        rf = req.response_format
        rf.type = worker_pb2.ResponseFormat.RESPONSE_FORMAT_TYPE_JSON_SCHEMA
        rf.name = fmt.json_schema.name
        rf.description = fmt.json_schema.description or ""
        rf.strict = bool(fmt.json_schema.strict)
        if fmt.json_schema.schema_ is not None:
            to_struct(fmt.json_schema.schema_, rf.schema)
