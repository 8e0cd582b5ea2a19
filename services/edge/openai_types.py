"""The OpenAI chat-completions request, as the edge accepts it, and the response shapes it sends.

Validation is pydantic's; :func:`parse_chat_request` turns its errors into one
:class:`InvalidRequest` whose ``param`` is the offending field's path (``messages[0].role``),
which is what the OpenAI SDK shows users.

Accepted but not supported features that would change the result (``n`` > 1, tools, audio,
response_format other than text) are refused with a clear message rather than ignored.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from services.common import limits
from services.common.errors import InvalidRequest

Role = Literal["system", "developer", "user", "assistant", "tool"]


def _valid_unicode(value: str) -> str:
    # JSON escapes can smuggle lone surrogates ("\ud800") that no UTF-8 encoder accepts.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains an invalid Unicode escape (lone surrogate)") from None
    return value


Text = Annotated[StrictStr, AfterValidator(_valid_unicode)]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: Annotated[Text, Field(max_length=limits.MAX_CONTENT_CHARS)]


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Role
    content: (
        Annotated[Text, Field(max_length=limits.MAX_CONTENT_CHARS)]
        | Annotated[list[ContentPart], Field(min_length=1, max_length=64)]
        | None
    ) = None
    name: Annotated[Text, Field(max_length=64)] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


Probability = Annotated[float, Field(ge=limits.TOP_P_RANGE[0], le=limits.TOP_P_RANGE[1])]
Penalty = Annotated[float, Field(ge=limits.PENALTY_RANGE[0], le=limits.PENALTY_RANGE[1])]


class ChatCompletionRequest(BaseModel):
    # Unknown top-level fields are ignored, as OpenAI does for forward compatibility.
    model_config = ConfigDict(extra="ignore")

    model: Annotated[Text, Field(min_length=1, max_length=limits.MAX_MODEL_NAME_CHARS)]
    messages: Annotated[list[ChatMessageIn], Field(min_length=1, max_length=limits.MAX_MESSAGES)]
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1, le=limits.MAX_TOKENS_CEILING)] | None = None
    max_completion_tokens: (
        Annotated[StrictInt, Field(ge=1, le=limits.MAX_TOKENS_CEILING)] | None
    ) = None
    temperature: (
        Annotated[float, Field(ge=limits.TEMPERATURE_RANGE[0], le=limits.TEMPERATURE_RANGE[1])]
        | None
    ) = None
    top_p: Probability | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] | None = None
    stop: (
        Annotated[Text, Field(min_length=1, max_length=limits.MAX_STOP_LENGTH)]
        | Annotated[
            list[Annotated[Text, Field(min_length=1, max_length=limits.MAX_STOP_LENGTH)]],
            Field(max_length=limits.MAX_STOP_SEQUENCES),
        ]
        | None
    ) = None
    seed: Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=limits.MAX_TOP_LOGPROBS)] | None = None
    user: Annotated[Text, Field(max_length=256)] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    # Meridian extension: keep generating past end-of-sequence (benchmarks).
    ignore_eos: StrictBool = False

    @field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _strict_number(cls, v: Any) -> Any:
        # Accept ints and floats, not strings or booleans ("0.5" is a client bug).
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ValueError("must be a number")
        return v

    def effective_max_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else (self.max_tokens)
        )

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


_BRANCH_LABELS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _param_path(loc: tuple[int | str, ...]) -> str:
    """``("messages", 0, "content", "str")`` → ``messages[0].content``.

    Pydantic adds union-branch and validator labels to the location; those are not part of
    the user's field path, and never look like a JSON field name we define.
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _BRANCH_LABELS or any(c in part for c in "[(-"):
            continue
        else:
            out += f".{part}" if out else part
    return out


def parse_chat_request(body: bytes) -> ChatCompletionRequest:
    """Parse and validate a request body; every failure names the field it is about."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidRequest(f"request body is not valid UTF-8 (byte {err.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {err.msg} at line {err.lineno} "
            f"column {err.colno}"
        ) from None
    except RecursionError:
        raise InvalidRequest("request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        req = ChatCompletionRequest.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        param = _param_path(tuple(first["loc"]))
        msg = first["msg"]
        if first["type"] == "missing":
            raise InvalidRequest(f"Missing required parameter: '{param}'.", param=param) from None
        raise InvalidRequest(f"Invalid value for '{param}': {msg}.", param=param) from None
    if req.tools:
        raise InvalidRequest("tools are not supported by this deployment", param="tools")
    if req.response_format and req.response_format.get("type", "text") != "text":
        raise InvalidRequest(
            "only response_format type 'text' is supported", param="response_format"
        )
    if req.top_logprobs and not req.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest(
            "stream_options is only allowed when stream is true", param="stream_options"
        )
    return req


def now_s() -> int:
    return int(time.time())
