"""Checks that make a chat request fail fast, before it reaches the engine, with a named param.

The engine contract (services/worker/engine.py) says ``generate`` raises before yielding for a
request that can never succeed. These checks are pure (no vllm import) so they are tested
directly with tables of cases, and so the error a client sees names the OpenAI field it sent
(``param``), which vLLM's own validation does only for some fields.

Ranges are OpenAI's (temperature 0..2, penalties -2..2, at most 4 stop strings, top_logprobs
0..20 and only with logprobs), narrowed where vLLM is narrower: ``top_p`` must be above 0
(vLLM divides by it), ``seed`` must fit a 64-bit signed integer (the proto's int64).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from services.common.errors import ContextLengthExceeded, InvalidRequest
from services.worker.engine import ChatTurn, SamplingOptions

MAX_STOP_SEQUENCES = 4
MAX_TOP_LOGPROBS = 20
ROLES: frozenset[str] = frozenset({"system", "developer", "user", "assistant", "tool"})
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def check_messages(messages: Sequence[ChatTurn]) -> None:
    """At least one message, each with a role the chat templates know."""
    if not messages:
        raise InvalidRequest("messages must hold at least one message", param="messages")
    for index, turn in enumerate(messages):
        if turn.role not in ROLES:
            raise InvalidRequest(
                f"messages[{index}].role must be one of {sorted(ROLES)}, got {turn.role!r}",
                param="messages",
            )


def check_sampling(options: SamplingOptions) -> None:
    """Every sampling value in its range; the error names the first field that is not."""
    _check_range("temperature", options.temperature, low=0.0, high=2.0)
    _check_range("presence_penalty", options.presence_penalty, low=-2.0, high=2.0)
    _check_range("frequency_penalty", options.frequency_penalty, low=-2.0, high=2.0)
    if options.top_p is not None and not (math.isfinite(options.top_p) and 0 < options.top_p <= 1):
        raise InvalidRequest(f"top_p must be in (0, 1], got {options.top_p}", param="top_p")
    if options.max_tokens is not None and options.max_tokens < 1:
        raise InvalidRequest(
            f"max_tokens must be at least 1, got {options.max_tokens}", param="max_tokens"
        )
    if len(options.stop) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(
            f"stop holds at most {MAX_STOP_SEQUENCES} sequences, got {len(options.stop)}",
            param="stop",
        )
    if any(not s for s in options.stop):
        raise InvalidRequest("stop sequences must not be empty", param="stop")
    if options.seed is not None and not _INT64_MIN <= options.seed <= _INT64_MAX:
        raise InvalidRequest("seed must fit a 64-bit signed integer", param="seed")
    if not 0 <= options.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(
            f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {options.top_logprobs}",
            param="top_logprobs",
        )
    if options.top_logprobs and not options.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")


def completion_budget(
    *, prompt_tokens: int, max_model_len: int, max_tokens: int | None, where: str = "messages"
) -> int:
    """The number of tokens this request may generate.

    ``max_tokens`` when it fits beside the prompt, the rest of the context when it is None.
    A prompt that fills the whole context leaves no room whatever ``max_tokens`` says: that is
    the messages' fault (:class:`ContextLengthExceeded`, param ``messages``); a prompt that
    fits with a ``max_tokens`` that does not is ``max_tokens``'s (param ``max_tokens``).
    """
    if prompt_tokens >= max_model_len:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_model_len} tokens, and the {where} "
            f"take {prompt_tokens} tokens, leaving no room for a completion.",
            param=where,
        )
    room = max_model_len - prompt_tokens
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise InvalidRequest(
            f"max_tokens is {max_tokens}, but the {where} take {prompt_tokens} of this "
            f"model's {max_model_len}-token context, leaving room for {room}.",
            param="max_tokens",
        )
    return max_tokens


def _check_range(param: str, value: float | None, *, low: float, high: float) -> None:
    if value is None:
        return
    if not (math.isfinite(value) and low <= value <= high):
        raise InvalidRequest(f"{param} must be in [{low:g}, {high:g}], got {value}", param=param)
