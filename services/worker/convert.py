"""Proto ↔ engine types for the worker, with validation of everything a gRPC caller sends.

The worker is reachable over the network, so it does not trust the edge's validation: every
field is checked here and a bad one raises :class:`InvalidRequest` naming the field.
"""

from __future__ import annotations

import math
from typing import Any

import jsonschema_rs
from google.protobuf.struct_pb2 import Struct

from meridian.v1 import worker_pb2
from services.common import limits
from services.common.errors import InvalidRequest
from services.common.jsonstruct import from_struct
from services.common.schema_rules import KNOWN_DRAFTS, nested_past
from services.worker.engine import (
    ChatTurn,
    EmbedRequest,
    EmbedResult,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    ModelDescription,
    ModelState,
    RawPrompt,
    ResponseFormat,
    ResumeInput,
    SamplingOptions,
    ToolCall,
    ToolChoice,
    ToolSpec,
)

_FINISH_TO_PB = {
    FinishReason.STOP: worker_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: worker_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: worker_pb2.FINISH_REASON_ABORT,
    FinishReason.TOOL_CALLS: worker_pb2.FINISH_REASON_TOOL_CALLS,
}

#: The most tools one request may declare, and choices it may ask for (the edge's cap is
#: usually lower; this is what the worker accepts from anyone).
MAX_TOOLS = 128
MAX_CHOICES = limits.MAX_CHOICES
MAX_LOGIT_BIAS = 1024
MAX_STOP_TOKEN_IDS = 64

_TOOL_CHOICE = {
    worker_pb2.ToolChoice.TOOL_CHOICE_MODE_UNSPECIFIED: "auto",
    worker_pb2.ToolChoice.TOOL_CHOICE_MODE_AUTO: "auto",
    worker_pb2.ToolChoice.TOOL_CHOICE_MODE_NONE: "none",
    worker_pb2.ToolChoice.TOOL_CHOICE_MODE_REQUIRED: "required",
    worker_pb2.ToolChoice.TOOL_CHOICE_MODE_FUNCTION: "function",
}
_RESPONSE_FORMAT = {
    worker_pb2.ResponseFormat.RESPONSE_FORMAT_TYPE_TEXT: "text",
    worker_pb2.ResponseFormat.RESPONSE_FORMAT_TYPE_JSON_OBJECT: "json_object",
    worker_pb2.ResponseFormat.RESPONSE_FORMAT_TYPE_JSON_SCHEMA: "json_schema",
}

_STATE_TO_PB = {
    ModelState.LOADING: worker_pb2.MODEL_STATE_LOADING,
    ModelState.READY: worker_pb2.MODEL_STATE_READY,
    ModelState.DRAINING: worker_pb2.MODEL_STATE_DRAINING,
    ModelState.FAILED: worker_pb2.MODEL_STATE_FAILED,
}


def _check_range(
    value: float | None, name: str, lo: float, hi: float, *, lo_open: bool = False
) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
        bracket = "(" if lo_open else "["
        raise InvalidRequest(f"{name} must be in {bracket}{lo}, {hi}], got {value}", param=name)


def sampling_from_pb(pb: worker_pb2.SamplingParams) -> SamplingOptions:
    temperature = pb.temperature if pb.HasField("temperature") else None
    top_p = pb.top_p if pb.HasField("top_p") else None
    presence = pb.presence_penalty if pb.HasField("presence_penalty") else None
    frequency = pb.frequency_penalty if pb.HasField("frequency_penalty") else None
    _check_range(temperature, "temperature", *limits.TEMPERATURE_RANGE)
    _check_range(top_p, "top_p", *limits.TOP_P_RANGE, lo_open=True)
    _check_range(presence, "presence_penalty", *limits.PENALTY_RANGE)
    _check_range(frequency, "frequency_penalty", *limits.PENALTY_RANGE)
    max_tokens = pb.max_tokens if pb.HasField("max_tokens") else None
    if max_tokens is not None and not 1 <= max_tokens <= limits.MAX_TOKENS_CEILING:
        raise InvalidRequest(
            f"max_tokens must be between 1 and {limits.MAX_TOKENS_CEILING}, got {max_tokens}",
            param="max_tokens",
        )
    if len(pb.stop) > limits.MAX_STOP_SEQUENCES:
        raise InvalidRequest(
            f"stop accepts at most {limits.MAX_STOP_SEQUENCES} sequences", param="stop"
        )
    for s in pb.stop:
        if not s or len(s) > limits.MAX_STOP_LENGTH:
            raise InvalidRequest(
                f"each stop sequence must be 1..{limits.MAX_STOP_LENGTH} characters", param="stop"
            )
    if pb.top_logprobs > limits.MAX_TOP_LOGPROBS:
        raise InvalidRequest(
            f"top_logprobs must be at most {limits.MAX_TOP_LOGPROBS}", param="top_logprobs"
        )
    top_k = pb.top_k if pb.HasField("top_k") else None
    if top_k is not None and top_k < -1:
        raise InvalidRequest(f"top_k must be -1, 0 or positive, got {top_k}", param="top_k")
    min_p = pb.min_p if pb.HasField("min_p") else None
    _check_range(min_p, "min_p", 0.0, 1.0)
    repetition = pb.repetition_penalty if pb.HasField("repetition_penalty") else None
    _check_range(repetition, "repetition_penalty", 0.0, 2.0, lo_open=True)
    min_tokens = pb.min_tokens if pb.HasField("min_tokens") else None
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequest(
            f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})",
            param="min_tokens",
        )
    if len(pb.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidRequest(
            f"stop_token_ids accepts at most {MAX_STOP_TOKEN_IDS} ids", param="stop_token_ids"
        )
    if len(pb.logit_bias) > MAX_LOGIT_BIAS:
        raise InvalidRequest(
            f"logit_bias accepts at most {MAX_LOGIT_BIAS} tokens", param="logit_bias"
        )
    for token, bias in pb.logit_bias.items():
        _check_range(bias, f"logit_bias.{token}", -100.0, 100.0)
    return SamplingOptions(
        top_k=top_k,
        min_p=min_p,
        repetition_penalty=repetition,
        min_tokens=min_tokens,
        stop_token_ids=tuple(pb.stop_token_ids),
        logit_bias=tuple(sorted(pb.logit_bias.items())),
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        stop=tuple(pb.stop),
        seed=pb.seed if pb.HasField("seed") else None,
        presence_penalty=presence,
        frequency_penalty=frequency,
        logprobs=pb.logprobs,
        top_logprobs=pb.top_logprobs,
        ignore_eos=pb.ignore_eos,
    )


#: The router's Priority values (router.proto): UNSPECIFIED (= STANDARD), LOW, STANDARD, HIGH.
_PRIORITIES = range(0, 4)


def _priority(value: int) -> int:
    """A priority the engines know; any other int32 from a client is refused, not passed to
    the scheduler (vLLM's priority policy orders by it: -2**31 would jump every queue)."""
    if value not in _PRIORITIES:
        raise InvalidRequest(
            f"priority must be a router Priority (0..3), got {value}", param="priority"
        )
    return value


def request_from_pb(pb: worker_pb2.GenerateRequest, *, traceparent: str = "") -> EngineRequest:
    """Validate a Generate request and turn it into the engine's type (``traceparent``: the
    worker span's W3C context, passed on to the engine)."""
    if not pb.request_id or len(pb.request_id) > limits.MAX_REQUEST_ID_CHARS:
        raise InvalidRequest(
            f"request_id must be 1..{limits.MAX_REQUEST_ID_CHARS} characters", param="request_id"
        )
    if not pb.model or len(pb.model) > limits.MAX_MODEL_NAME_CHARS:
        raise InvalidRequest("model is required", param="model")
    _check_ids(pb.tenant_id, pb.decision_id)
    if pb.HasField("raw_prompt"):
        if pb.messages:
            raise InvalidRequest("give messages or raw_prompt, not both", param="messages")
        _refuse_chat_only_fields(pb)
        return EngineRequest(
            request_id=pb.request_id,
            model=pb.model,
            messages=(),
            sampling=sampling_from_pb(pb.sampling),
            priority=_priority(pb.priority),
            prompt=raw_prompt_from_pb(pb.raw_prompt, "prompt"),
            echo=pb.echo,
        )
    if pb.echo:
        raise InvalidRequest("echo is for raw prompts (completions) only", param="echo")
    if not pb.messages:
        raise InvalidRequest("messages must not be empty", param="messages")
    if len(pb.messages) > limits.MAX_MESSAGES:
        raise InvalidRequest(
            f"at most {limits.MAX_MESSAGES} messages are accepted", param="messages"
        )
    turns = []
    for i, m in enumerate(pb.messages):
        if m.role not in limits.CHAT_ROLES:
            raise InvalidRequest(
                f"messages[{i}].role must be one of {sorted(limits.CHAT_ROLES)}, got {m.role!r}",
                param=f"messages[{i}].role",
            )
        _at_most(m.content, limits.MAX_CONTENT_CHARS, f"messages[{i}].content")
        _at_most(m.name, limits.MAX_FUNCTION_NAME_CHARS, f"messages[{i}].name")
        _at_most(m.tool_call_id, limits.MAX_CALL_ID_CHARS, f"messages[{i}].tool_call_id")
        calls = _tool_calls(m.tool_calls, i)
        if calls and m.role != "assistant":
            raise InvalidRequest(
                f"messages[{i}].tool_calls is only allowed on assistant messages",
                param=f"messages[{i}].tool_calls",
            )
        turns.append(
            ChatTurn(
                role=m.role,
                content=m.content,
                name=m.name,
                tool_calls=calls,
                tool_call_id=m.tool_call_id,
            )
        )
    tools = tools_from_pb(pb)
    sampling = sampling_from_pb(pb.sampling)
    return EngineRequest(
        request_id=pb.request_id,
        model=pb.model,
        messages=tuple(turns),
        sampling=sampling,
        priority=_priority(pb.priority),
        tools=tools,
        tool_choice=tool_choice_from_pb(pb.tool_choice, tools),
        parallel_tool_calls=(
            pb.parallel_tool_calls if pb.HasField("parallel_tool_calls") else True
        ),
        response_format=response_format_from_pb(pb.response_format),
        resume=resume_from_pb(pb, sampling) if pb.HasField("resume") else None,
        truncate_oldest=pb.truncate_oldest,
        traceparent=traceparent,
    )


def _check_ids(tenant_id: str, decision_id: str) -> None:
    _at_most(tenant_id, limits.MAX_TENANT_ID_CHARS, "tenant_id")
    _at_most(decision_id, limits.MAX_DECISION_ID_CHARS, "decision_id")


def _at_most(value: str, limit: int, param: str) -> None:
    """A string field the contract bounds: longer is this request's 400, naming it."""
    if len(value) > limit:
        raise InvalidRequest(f"{param} is longer than {limit} characters", param=param)


def _tool_calls(calls: Any, i: int) -> tuple[ToolCall, ...]:
    """An assistant turn's calls, each bounded (the edge's bounds: its ToolCallIn)."""
    where = f"messages[{i}].tool_calls"
    if len(calls) > limits.MAX_TOOL_CALLS:
        raise InvalidRequest(f"{where} has more than {limits.MAX_TOOL_CALLS} calls", param=where)
    for j, c in enumerate(calls):
        _at_most(c.id, limits.MAX_CALL_ID_CHARS, f"{where}[{j}].id")
        _at_most(c.name, limits.MAX_FUNCTION_NAME_CHARS, f"{where}[{j}].function.name")
        _at_most(c.arguments, limits.MAX_CONTENT_CHARS, f"{where}[{j}].function.arguments")
    return tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls)


def choices_from_pb(pb: worker_pb2.GenerateRequest) -> int:
    """How many choices to generate (``n``; 0 means 1)."""
    n = pb.n or 1
    if n > MAX_CHOICES:
        raise InvalidRequest(f"n must be at most {MAX_CHOICES}, got {n}", param="n")
    if n > 1 and pb.HasField("resume"):
        # The delivered tokens are one sequence's; every choice would continue that one.
        raise InvalidRequest(
            f"resume continues one choice's stream; it cannot be given with n = {n}",
            param="resume",
        )
    return n


def tools_from_pb(pb: worker_pb2.GenerateRequest) -> tuple[ToolSpec, ...]:
    if len(pb.tools) > MAX_TOOLS:
        raise InvalidRequest(f"at most {MAX_TOOLS} tools are accepted", param="tools")
    out: list[ToolSpec] = []
    seen: set[str] = set()
    for i, tool in enumerate(pb.tools):
        fn = tool.function
        if tool.type not in ("", "function"):
            raise InvalidRequest(
                f"tools[{i}].type must be 'function', got {tool.type!r}", param=f"tools[{i}].type"
            )
        if not fn.name or len(fn.name) > 64 or fn.name in seen:
            raise InvalidRequest(
                f"tools[{i}].function.name must be 1..64 characters and unique",
                param=f"tools[{i}].function.name",
            )
        seen.add(fn.name)
        params = (
            _schema(fn.parameters, f"tools[{i}].function.parameters")
            if fn.HasField("parameters")
            else None
        )
        out.append(
            ToolSpec(name=fn.name, description=fn.description, parameters=params, strict=fn.strict)
        )
    return tuple(out)


def tool_choice_from_pb(pb: worker_pb2.ToolChoice, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    mode = _TOOL_CHOICE.get(pb.mode)
    if mode is None:
        raise InvalidRequest("tool_choice has an unknown mode", param="tool_choice")
    if mode in ("required", "function") and not tools:
        raise InvalidRequest(f"tool_choice {mode!r} needs tools", param="tool_choice")
    if mode == "function" and pb.function_name not in {t.name for t in tools}:
        raise InvalidRequest(
            f"tool_choice names function {pb.function_name!r}, which is not in tools",
            param="tool_choice.function.name",
        )
    return ToolChoice(mode=mode, function=pb.function_name if mode == "function" else "")  # type: ignore[arg-type]


def response_format_from_pb(pb: worker_pb2.ResponseFormat) -> ResponseFormat:
    kind = _RESPONSE_FORMAT.get(pb.type)
    if kind is None:
        raise InvalidRequest("response_format has an unknown type", param="response_format.type")
    if kind != "json_schema":
        return ResponseFormat(type=kind)  # type: ignore[arg-type]
    if not pb.HasField("schema"):
        raise InvalidRequest(
            "response_format json_schema needs a schema", param="response_format.json_schema"
        )
    schema = _schema(pb.schema, "response_format.json_schema.schema")
    return ResponseFormat(type="json_schema", schema=schema, name=pb.name, strict=pb.strict)


def _schema(struct: Struct, param: str) -> dict[str, Any]:
    """A Struct as a JSON schema, held to what the edge holds one to: nested at most
    ``limits.MAX_SCHEMA_DEPTH`` deep and valid against its metaschema (``{"type": 5}`` is
    not a schema). A Struct can hold what JSON cannot (NaN, infinities): protobuf's
    converter refuses it with a ValueError, which must be this request's 400, not the call's
    INTERNAL (the edge never sends one; another gRPC client can)."""
    try:
        schema = from_struct(struct)
    except ValueError as err:
        raise InvalidRequest(f"{param} is not JSON: {err}", param=param) from None
    if nested_past(schema, limits.MAX_SCHEMA_DEPTH) is not None:
        raise InvalidRequest(
            f"{param}: objects and arrays nest more than {limits.MAX_SCHEMA_DEPTH} deep",
            param=param,
        )
    draft = schema.get("$schema")
    if draft is not None and draft not in KNOWN_DRAFTS:
        raise InvalidRequest(
            f"{param}: $schema must name a JSON-schema draft (04, 06, 07, 2019-09 or 2020-12)",
            param=param,
        )
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as err:
        where = "/".join(str(p) for p in err.instance_path)
        raise InvalidRequest(
            f"{param} is not a valid JSON schema: {err.message}"
            + (f" (at {where})" if where else ""),
            param=param,
        ) from None
    except (jsonschema_rs.ReferencingError, ValueError, RecursionError) as err:
        raise InvalidRequest(f"{param} is not a valid JSON schema: {err}", param=param) from None
    return schema


#: The longest delivered-text tail a continuing worker accepts (stop strings are shorter).
MAX_RESUME_TAIL_CHARS = 256


def resume_from_pb(pb: worker_pb2.GenerateRequest, sampling: SamplingOptions) -> ResumeInput:
    """Validate a migrated stream's resume state (it comes over the network, like the rest)."""
    r = pb.resume
    ids = tuple(r.delivered_token_ids)
    if not ids:
        raise InvalidRequest(
            "resume.delivered_token_ids must not be empty", param="resume.delivered_token_ids"
        )
    ceiling = sampling.max_tokens if sampling.max_tokens is not None else limits.MAX_TOKENS_CEILING
    if len(ids) >= ceiling:
        raise InvalidRequest(
            f"resume.delivered_token_ids has {len(ids)} tokens; nothing is left to generate "
            f"under max_tokens {ceiling}",
            param="resume.delivered_token_ids",
        )
    if len(r.delivered_text_tail) > MAX_RESUME_TAIL_CHARS:
        raise InvalidRequest(
            f"resume.delivered_text_tail is longer than {MAX_RESUME_TAIL_CHARS} characters",
            param="resume.delivered_text_tail",
        )
    if len(r.delivered_text_tail) > r.delivered_text_chars:
        raise InvalidRequest(
            "resume.delivered_text_tail is longer than resume.delivered_text_chars",
            param="resume.delivered_text_tail",
        )
    if len(r.origin_request_id) > limits.MAX_REQUEST_ID_CHARS:
        raise InvalidRequest(
            f"resume.origin_request_id must be at most {limits.MAX_REQUEST_ID_CHARS} characters",
            param="resume.origin_request_id",
        )
    return ResumeInput(
        delivered_token_ids=ids,
        delivered_text_chars=r.delivered_text_chars,
        delivered_text_tail=r.delivered_text_tail,
        origin_request_id=r.origin_request_id,
        migrations=r.migrations,
    )


def _refuse_chat_only_fields(pb: worker_pb2.GenerateRequest) -> None:
    """A raw prompt (completions) has no tools, response format, choices or resume here:
    given, they would be dropped without a word (the edge never sends them; another gRPC
    client can)."""
    given = [
        name
        for name, present in (
            ("tools", bool(pb.tools)),
            ("tool_choice", pb.HasField("tool_choice")),
            ("parallel_tool_calls", pb.HasField("parallel_tool_calls")),
            ("response_format", pb.HasField("response_format")),
            ("n", pb.n > 1),
            ("resume", pb.HasField("resume")),
        )
        if present
    ]
    if given:
        raise InvalidRequest(
            f"{given[0]} is not supported with raw_prompt (completions)", param=given[0]
        )


def raw_prompt_from_pb(pb: worker_pb2.RawPrompt, param: str) -> RawPrompt:
    """Text or token ids, exactly one, within the protocol's bounds; errors name ``param``."""
    if pb.text and pb.token_ids:
        raise InvalidRequest(f"{param}: give text or token ids, not both", param=param)
    if pb.token_ids:
        if len(pb.token_ids) > limits.MAX_PROMPT_TOKEN_IDS:
            raise InvalidRequest(
                f"{param} has more than {limits.MAX_PROMPT_TOKEN_IDS} token ids", param=param
            )
        if max(pb.token_ids) > limits.MAX_TOKEN_ID:
            raise InvalidRequest(f"{param} has a token id out of range", param=param)
        return RawPrompt(token_ids=tuple(pb.token_ids))
    if not pb.text:
        raise InvalidRequest(f"{param} must not be empty", param=param)
    _at_most(pb.text, limits.MAX_CONTENT_CHARS, param)
    return RawPrompt(text=pb.text)


def embed_request_from_pb(pb: worker_pb2.EmbedRequest) -> EmbedRequest:
    """Validate an Embed request; a bad input is named by its index (``input[3]``)."""
    if not pb.request_id or len(pb.request_id) > limits.MAX_REQUEST_ID_CHARS:
        raise InvalidRequest(
            f"request_id must be 1..{limits.MAX_REQUEST_ID_CHARS} characters", param="request_id"
        )
    if not pb.model or len(pb.model) > limits.MAX_MODEL_NAME_CHARS:
        raise InvalidRequest("model is required", param="model")
    _check_ids(pb.tenant_id, pb.decision_id)
    if not pb.inputs:
        raise InvalidRequest("input must not be empty", param="input")
    if len(pb.inputs) > limits.MAX_EMBEDDING_INPUTS:
        raise InvalidRequest(
            f"at most {limits.MAX_EMBEDDING_INPUTS} inputs per request", param="input"
        )
    inputs = tuple(raw_prompt_from_pb(x, f"input[{i}]") for i, x in enumerate(pb.inputs))
    return EmbedRequest(
        request_id=pb.request_id,
        model=pb.model,
        inputs=inputs,
        dimensions=pb.dimensions,
        priority=_priority(pb.priority),
    )


def embed_result_to_pb(result: EmbedResult) -> worker_pb2.EmbedResponse:
    resp = worker_pb2.EmbedResponse()
    for vector, tokens in zip(result.vectors, result.prompt_tokens, strict=True):
        resp.embeddings.add(values=vector, prompt_tokens=tokens)
    resp.usage.prompt_tokens = sum(result.prompt_tokens)
    resp.timings.queue_ms = result.queue_ms
    resp.timings.prefill_ms = result.compute_ms
    return resp


def chunk_to_pb(out: EngineOutput) -> worker_pb2.GenerateChunk:
    chunk = worker_pb2.GenerateChunk(text=out.text, token_ids=out.token_ids, handoff=out.handoff)
    chunk.usage.prompt_tokens = out.prompt_tokens
    chunk.usage.completion_tokens = out.completion_tokens
    chunk.usage.cached_prompt_tokens = out.cached_prompt_tokens
    if out.finish_reason is not None:
        chunk.finish_reason = _FINISH_TO_PB[out.finish_reason]
    if out.queue_ms is not None:
        chunk.timings.queue_ms = out.queue_ms
    if out.prefill_ms is not None:
        chunk.timings.prefill_ms = out.prefill_ms
    if out.decode_ms is not None:
        chunk.timings.decode_ms = out.decode_ms
    for lp in out.logprobs:
        entry = chunk.logprobs.add(token=lp.token, logprob=lp.logprob)
        for tok, val in lp.top:
            entry.top.add(token=tok, logprob=val)
    for call in out.tool_calls:
        chunk.tool_calls.add(
            index=call.index,
            id=call.id,
            type="function" if call.id else "",
            name=call.name,
            arguments=call.arguments,
        )
    if out.prompt_text:
        chunk.prompt_text = out.prompt_text
    for lp in out.prompt_logprobs:
        entry = chunk.prompt_logprobs.add(token=lp.token, logprob=lp.logprob)
        for tok, val in lp.top:
            entry.top.add(token=tok, logprob=val)
    return chunk


def model_to_pb(
    m: ModelDescription, *, draining: bool, created_unix_s: int = 0
) -> worker_pb2.ModelInfo:
    state = ModelState.DRAINING if draining and m.state is ModelState.READY else m.state
    return worker_pb2.ModelInfo(
        name=m.name,
        state=_STATE_TO_PB[state],
        max_model_len=m.max_model_len,
        engine=m.engine,
        capabilities=m.capabilities.to_pb(),
        created_unix_s=created_unix_s,
    )


def load_to_pb(load: EngineLoad, report: worker_pb2.LoadReport) -> None:
    """Fill the load fields of ``report`` in place."""
    report.running = load.running
    report.waiting = load.waiting
    report.max_running = load.max_running
    report.kv_cache_usage = load.kv_cache_usage
    report.tokens_per_second = load.tokens_per_second
    report.prefix_cache_hit_rate = load.prefix_cache_hit_rate
    for g in load.gpus:
        report.gpus.add(
            index=g.index, utilization=g.utilization, memory_used_fraction=g.memory_used_fraction
        )
