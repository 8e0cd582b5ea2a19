"""Proto ↔ engine types for the worker, with validation of everything a gRPC caller sends.

The worker is reachable over the network, so it does not trust the edge's validation: every
field is checked here and a bad one raises :class:`InvalidRequest` naming the field.
"""

from __future__ import annotations

import math

from meridian.v1 import worker_pb2
from services.common import limits
from services.common.errors import InvalidRequest
from services.worker.engine import (
    ChatTurn,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    ModelDescription,
    ModelState,
    SamplingOptions,
)

_FINISH_TO_PB = {
    FinishReason.STOP: worker_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: worker_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: worker_pb2.FINISH_REASON_ABORT,
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
    return SamplingOptions(
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


def request_from_pb(pb: worker_pb2.GenerateRequest, *, traceparent: str = "") -> EngineRequest:
    """Validate a Generate request and turn it into the engine's type (``traceparent``: the
    worker span's W3C context, passed on to the engine)."""
    if not pb.request_id or len(pb.request_id) > limits.MAX_REQUEST_ID_CHARS:
        raise InvalidRequest(
            f"request_id must be 1..{limits.MAX_REQUEST_ID_CHARS} characters", param="request_id"
        )
    if not pb.model or len(pb.model) > limits.MAX_MODEL_NAME_CHARS:
        raise InvalidRequest("model is required", param="model")
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
        if len(m.content) > limits.MAX_CONTENT_CHARS:
            raise InvalidRequest(
                f"messages[{i}].content is longer than {limits.MAX_CONTENT_CHARS} characters",
                param=f"messages[{i}].content",
            )
        turns.append(ChatTurn(role=m.role, content=m.content, name=m.name))
    return EngineRequest(
        request_id=pb.request_id,
        model=pb.model,
        messages=tuple(turns),
        sampling=sampling_from_pb(pb.sampling),
        priority=pb.priority,
        traceparent=traceparent,
    )


def chunk_to_pb(out: EngineOutput) -> worker_pb2.GenerateChunk:
    chunk = worker_pb2.GenerateChunk(text=out.text, token_ids=out.token_ids)
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
    return chunk


def model_to_pb(m: ModelDescription, *, draining: bool) -> worker_pb2.ModelInfo:
    state = ModelState.DRAINING if draining and m.state is ModelState.READY else m.state
    return worker_pb2.ModelInfo(
        name=m.name, state=_STATE_TO_PB[state], max_model_len=m.max_model_len, engine=m.engine
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
