"""The OpenAI chat-completions request, as the edge accepts it, and the response shapes it sends.

Validation is pydantic's; :func:`parse_chat_request` turns its errors into one
:class:`InvalidRequest` whose ``param`` is the offending field's path (``messages[0].role``),
which is what the OpenAI SDK shows users.

Tools (``tools``, ``tool_choice``, ``parallel_tool_calls``, assistant ``tool_calls`` and
``tool`` messages), structured outputs (``response_format`` ``json_object`` and
``json_schema``), ``n`` and vLLM's sampling extensions (``top_k``, ``min_p``,
``repetition_penalty``, ``min_tokens``, ``stop_token_ids``, ``logit_bias``) are parsed into
typed fields and checked here: every JSON schema against its metaschema (``jsonschema_rs``), a
named ``tool_choice`` against ``tools``, every ``tool`` message against an earlier call. What
the edge cannot know (whether an engine's grammar backend compiles a schema) the worker
answers with INVALID_ARGUMENT naming the same field. Unknown fields are ignored, as OpenAI
does.
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Literal

import jsonschema_rs
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)
from pydantic_core import ErrorDetails

from services.common import limits
from services.common.errors import InvalidRequest
from services.common.schema_rules import KNOWN_DRAFTS, nested_past
from services.edge.jsonbody import load_object

Role = Literal["system", "developer", "user", "assistant", "tool"]


def _valid_unicode(value: object) -> object:
    # JSON escapes can smuggle lone surrogates ("\ud800") that no UTF-8 encoder accepts.
    # Before the string's own checks: a length limit fails on such a string with a vaguer
    # message, and a type mismatch is left to them.
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("contains an invalid Unicode escape (lone surrogate)") from None
    return value


VALID_UNICODE = BeforeValidator(_valid_unicode)
#: A string without lone surrogates. A length limit goes beside it, as in
#: ``Annotated[StrictStr, Field(max_length=n), VALID_UNICODE]``: on an alias that already holds
#: a validator, pydantic's message becomes "at most n items" instead of "n characters".
Text = Annotated[StrictStr, VALID_UNICODE]

# An API key pasted into ``model`` (arguments swapped: a common slip) would travel on to the
# router and into its logs as the "unknown model" it asked for. Meridian's keys and the
# other providers' usual ``sk-…`` ones are refused here, without echoing them — anywhere in
# the name, not only as all of it: ``"Bearer mk-…"`` or a key with a trailing space is the
# same slip.
_KEY_LIKE = re.compile(r"(?<![A-Za-z0-9_-])(?:mk-[A-Za-z0-9_-]{40,}|sk-[A-Za-z0-9_-]{20,})")


def _not_a_key(value: str) -> str:
    if _KEY_LIKE.search(value):
        raise ValueError(
            "this looks like an API key, not a model name (send the key in the "
            "Authorization header; it was not stored or logged)"
        )
    return value


ModelName = Annotated[
    StrictStr,
    Field(min_length=1, max_length=limits.MAX_MODEL_NAME_CHARS),
    VALID_UNICODE,
    AfterValidator(_not_a_key),
]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: Annotated[StrictStr, Field(max_length=limits.MAX_CONTENT_CHARS), VALID_UNICODE]


FunctionName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
MAX_TOOLS = 128
MAX_TOOL_CALLS = limits.MAX_TOOL_CALLS
MAX_CALL_ID_CHARS = limits.MAX_CALL_ID_CHARS
MAX_LOGIT_BIAS = 1024
MAX_STOP_TOKEN_IDS = 64
HARD_MAX_N = limits.MAX_CHOICES  # what the parser accepts; RequestLimits.max_choices caps it


class ToolCallFunctionIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: FunctionName
    arguments: Annotated[StrictStr, Field(max_length=limits.MAX_CONTENT_CHARS), VALID_UNICODE] = ""


class ToolCallIn(BaseModel):
    """A call in an assistant message of the history."""

    model_config = ConfigDict(extra="ignore")
    id: Annotated[StrictStr, Field(min_length=1, max_length=MAX_CALL_ID_CHARS), VALID_UNICODE]
    type: Literal["function"] = "function"
    function: ToolCallFunctionIn


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Role
    content: (
        Annotated[StrictStr, Field(max_length=limits.MAX_CONTENT_CHARS), VALID_UNICODE]
        | Annotated[list[ContentPart], Field(min_length=1, max_length=64)]
        | None
    ) = None
    name: Annotated[StrictStr, Field(max_length=64), VALID_UNICODE] | None = None
    tool_calls: Annotated[list[ToolCallIn], Field(max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: (
        Annotated[StrictStr, Field(min_length=1, max_length=MAX_CALL_ID_CHARS), VALID_UNICODE]
        | None
    ) = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: FunctionName
    description: Annotated[StrictStr, Field(max_length=8192), VALID_UNICODE] | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ToolIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionIn


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: FunctionName


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: FunctionName
    description: Annotated[StrictStr, Field(max_length=8192), VALID_UNICODE] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["json_object"]


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormatIn = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False
    # OpenAI's (and its SDK's): random padding in an ``obfuscation`` field of each chunk.
    # Accepted and type-checked; Meridian sends no such field either way.
    include_obfuscation: StrictBool | None = None


Probability = Annotated[float, Field(ge=limits.TOP_P_RANGE[0], le=limits.TOP_P_RANGE[1])]
Penalty = Annotated[float, Field(ge=limits.PENALTY_RANGE[0], le=limits.PENALTY_RANGE[1])]


def a_number(v: Any) -> Any:
    # Ints and floats, not strings or booleans (lax pydantic reads "50" and true as numbers).
    if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
        raise ValueError("must be a number")
    return v


A_NUMBER = BeforeValidator(a_number)


def _null_is_false(v: Any) -> Any:
    return False if v is None else v


#: A flag OpenAI's API also takes as ``null`` (the SDKs send it for "not given").
Flag = Annotated[StrictBool, BeforeValidator(_null_is_false)]
#: OpenAI's ``metadata``: at most 16 pairs, keys up to 64 characters, values up to 512.
Metadata = Annotated[
    dict[
        Annotated[StrictStr, Field(max_length=64), VALID_UNICODE],
        Annotated[StrictStr, Field(max_length=512), VALID_UNICODE],
    ],
    Field(max_length=16),
]
#: OpenAI request fields for what Meridian does not do, refused by name: ignored, the answer
#: would silently not be what was asked for (no audio, no function_call, no predicted output).
_UNSUPPORTED = {
    "functions": "use 'tools' instead",
    "function_call": "use 'tool_choice' instead",
    "audio": "audio output is not served here",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not offered here",
}


#: Chat content part types OpenAI's models take and these text models do not.
_UNSUPPORTED_PARTS = {"image_url": "images", "input_audio": "audio", "file": "files"}


def refuse_unsupported(data: dict[str, Any]) -> None:
    """A 400 naming the first OpenAI field Meridian cannot honour (see ``_UNSUPPORTED``), or
    the first content part of a kind the models here do not read (an image, audio, a file),
    said as such rather than as "should be 'text'"."""
    for name, instead in _UNSUPPORTED.items():
        if data.get(name) is not None:
            raise InvalidRequest(
                f"Unsupported parameter: '{name}' is not supported; {instead}.",
                param=name,
                code="unsupported_parameter",
            )
    messages = data.get("messages")
    for i, m in enumerate(messages if isinstance(messages, list) else ()):
        content = m.get("content") if isinstance(m, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in _UNSUPPORTED_PARTS:
                at = f"messages[{i}].content[{j}].type"
                raise InvalidRequest(
                    f"Unsupported value for '{at}': {kind!r}; the models here read text, not "
                    f"{_UNSUPPORTED_PARTS[kind]}.",
                    param=at,
                    code="unsupported_value",
                )


#: The longest ``prompt_cache_key`` accepted (it is hashed into the session id the router sees).
MAX_PROMPT_CACHE_KEY = 1024


class ChatCompletionRequest(BaseModel):
    # Unknown top-level fields are ignored, as vLLM's server does: SDKs and proxies send
    # fields of their own. The OpenAI fields Meridian cannot honour are refused by name
    # (refuse_unsupported) and those that change nothing here are still type-checked.
    model_config = ConfigDict(extra="ignore")

    model: ModelName
    messages: Annotated[list[ChatMessageIn], Field(min_length=1, max_length=limits.MAX_MESSAGES)]
    stream: Flag = False
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
    n: Annotated[StrictInt, Field(ge=1, le=HARD_MAX_N)] | None = None
    stop: (
        Annotated[StrictStr, Field(min_length=1, max_length=limits.MAX_STOP_LENGTH), VALID_UNICODE]
        | Annotated[
            list[
                Annotated[
                    StrictStr, Field(min_length=1, max_length=limits.MAX_STOP_LENGTH), VALID_UNICODE
                ]
            ],
            Field(max_length=limits.MAX_STOP_SEQUENCES),
        ]
        | None
    ) = None
    seed: Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=limits.MAX_TOP_LOGPROBS)] | None = None
    user: Annotated[StrictStr, Field(max_length=256), VALID_UNICODE] | None = None
    tools: Annotated[list[ToolIn], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: ResponseFormatIn | None = None
    # vLLM's sampling extensions (its OpenAI server accepts them too).
    top_k: Annotated[StrictInt, Field(ge=-1, le=1_000_000)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0, le=limits.MAX_TOKENS_CEILING)] | None = None
    stop_token_ids: (
        Annotated[
            list[Annotated[StrictInt, Field(ge=0, le=2**32 - 1)]],
            Field(max_length=MAX_STOP_TOKEN_IDS),
        ]
        | None
    ) = None
    logit_bias: (
        Annotated[dict[str, Annotated[float, A_NUMBER]], Field(max_length=MAX_LOGIT_BIAS)] | None
    ) = None
    # OpenAI fields that change nothing here, but are type-checked as OpenAI does: a client
    # bug in them is a 400, not silence.
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    store: StrictBool | None = None
    metadata: Metadata | None = None
    modalities: Annotated[list[Literal["text"]], Field(max_length=1)] | None = None
    # Meridian extension: keep generating past end-of-sequence (benchmarks).
    ignore_eos: StrictBool = False
    # OpenAI's cache-routing hint: requests that share it are routed as one session (the
    # router's session affinity, so they find their prefix in the same worker's KV cache),
    # unless an x-session-id header names the session (stages/validate.session_id).
    prompt_cache_key: (
        Annotated[StrictStr, Field(min_length=1, max_length=MAX_PROMPT_CACHE_KEY), VALID_UNICODE]
        | None
    ) = None
    # Meridian extension, the Responses API's own: "auto" drops the oldest messages (after the
    # system/developer ones) until the prompt fits the model's context beside max_tokens,
    # instead of a context_length_exceeded error (services/worker/truncation.py).
    truncation: Literal["auto", "disabled"] | None = None

    @field_validator(
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "min_p",
        "repetition_penalty",
        mode="before",
    )
    @classmethod
    def _strict_number(cls, v: Any) -> Any:
        return a_number(v)  # "0.5" is a client bug

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

    def choices(self) -> int:
        return self.n or 1

    def response_format_type(self) -> str:
        return self.response_format.type if self.response_format is not None else "text"

    def tool_choice_mode(self) -> str:
        """``none`` | ``auto`` | ``required`` | ``function`` (a named function)."""
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            return "function"
        return choice or ("auto" if self.tools else "none")

    def uses_tools(self) -> bool:
        """Tools are offered and may be called (not ``tool_choice: none``)."""
        return bool(self.tools) and self.tool_choice_mode() != "none"

    @property
    def stream_state_portable(self) -> bool:
        """Whether this request's stream could be continued on another worker from its text so
        far (mid-stream migration): not with tools (a tool parser's state), a structured
        output (a grammar's state) or several choices."""
        return not self.tools and self.response_format_type() == "text" and self.choices() == 1

    def logit_bias_pairs(self) -> list[tuple[int, float]]:
        return logit_bias_pairs(self.logit_bias)


_BRANCH_LABELS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
_FORMAT_TAGS = frozenset({"text", "json_object", "json_schema"})


def _first_error(err: ValidationError) -> ErrorDetails:
    """The error to report: the first field's, and of a union's branches (``stop``: a string
    or a list) the one whose type the input has — a list of five stops is "at most 4 items",
    not "should be a valid string" — or a field missing deeper in it. A type mismatch is the
    least specific thing pydantic says about a value, so it is reported only when nothing
    more precise is said about that field."""
    errors = err.errors(include_url=False)
    field = errors[0]["loc"][:1]
    for e in errors:
        if e["loc"][:1] == field and not e["type"].endswith("_type"):
            return e
    return errors[0]


def _param_path(loc: tuple[int | str, ...]) -> str:
    """``("messages", 0, "content", "str")`` → ``messages[0].content``.

    Pydantic adds union-branch and validator labels to the location; those are not part of
    the user's field path, and never look like a JSON field name we define.
    """
    out = ""
    previous: int | str | None = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _BRANCH_LABELS or any(c in part for c in "[(-") or part[:1].isupper():
            continue  # a union branch (model names are CamelCase; fields are snake_case)
        elif previous == "response_format" and part in _FORMAT_TAGS:
            pass  # the discriminated union's tag, not a field
        else:
            out += f".{part}" if out else part
        previous = part
    return out


def parse_chat_request(body: bytes) -> ChatCompletionRequest:
    """Parse and validate a request body; every failure names the field it is about."""
    return validate_chat_request(load_object(body))


def validate_chat_request(data: dict[str, Any]) -> ChatCompletionRequest:
    """A parsed body → a chat request (or a 400 naming the field it is about); also how the
    Responses API's translated request is checked (openai_responses.chat_body)."""
    refuse_unsupported(data)
    try:
        req = ChatCompletionRequest.model_validate(data)
    except ValidationError as err:
        first = _first_error(err)
        param = _param_path(tuple(first["loc"]))
        msg = first["msg"]
        if first["type"] == "missing":
            raise InvalidRequest(f"Missing required parameter: '{param}'.", param=param) from None
        raise InvalidRequest(f"Invalid value for '{param}': {msg}.", param=param) from None
    check_features(req)
    if req.top_logprobs and not req.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest(
            "stream_options is only allowed when stream is true", param="stream_options"
        )
    return req


def _check_schema(schema: dict[str, Any], param: str) -> None:
    """A JSON schema must be valid against its metaschema (draft 2020-12 unless ``$schema``
    names another draft). ``jsonschema_rs`` checks it in microseconds where the pure-Python
    ``jsonschema`` takes milliseconds of the event loop per new schema (bench/README.md).
    Nested at most ``limits.MAX_SCHEMA_DEPTH`` deep: deeper cannot reach a worker."""
    where = nested_past(schema, limits.MAX_SCHEMA_DEPTH)
    if where is not None:
        raise InvalidRequest(
            f"Invalid schema for '{param}': objects and arrays nest more than "
            f"{limits.MAX_SCHEMA_DEPTH} deep (at {where or '/'})",
            param=param,
            code="invalid_schema",
        )
    draft = schema.get("$schema")
    if draft is not None and draft not in KNOWN_DRAFTS:
        raise InvalidRequest(
            f"Invalid schema for '{param}': $schema must name a JSON-schema draft "
            "(04, 06, 07, 2019-09 or 2020-12)",
            param=param,
            code="invalid_schema",
        )
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as err:
        where = "/".join(str(p) for p in err.instance_path)
        raise InvalidRequest(
            f"Invalid schema for '{param}': {err.message}" + (f" (at {where})" if where else ""),
            param=param,
            code="invalid_schema",
        ) from None
    except (jsonschema_rs.ReferencingError, ValueError, RecursionError) as err:
        raise InvalidRequest(
            f"Invalid schema for '{param}': {err}", param=param, code="invalid_schema"
        ) from None
    try:
        # Compiled as well: the metaschema passes a $ref that points nowhere, or a pattern
        # that is not a regex, which the worker's grammar compiler then fails on. Remote
        # references are never fetched (no worker would fetch them either).
        jsonschema_rs.validator_for(schema, retriever=_no_remote_refs)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as err:
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else "does not compile"
        raise InvalidRequest(
            f"Invalid schema for '{param}': {first}", param=param, code="invalid_schema"
        ) from None


def _no_remote_refs(uri: str) -> Any:
    raise ValueError(f"the reference {uri[:200]!r} is not in the schema (nothing is fetched)")


def check_logit_bias(bias: dict[str, float] | None) -> None:
    """Keys token ids (ASCII digits, under 2**32), values in [-100, 100] (chat, completions)."""
    for key, value in (bias or {}).items():
        if not (key.isascii() and key.isdigit()) or int(key) >= 2**32:
            raise InvalidRequest(
                f"logit_bias keys must be token ids (non-negative integers), got {key!r}",
                param="logit_bias",
            )
        if not -100.0 <= value <= 100.0:
            raise InvalidRequest(
                f"logit_bias values must be between -100 and 100, got {value}",
                param=f"logit_bias.{key}",
            )


def logit_bias_pairs(bias: dict[str, float] | None) -> list[tuple[int, float]]:
    """``logit_bias`` with its keys as token ids (checked by :func:`check_logit_bias`)."""
    return [(int(k), v) for k, v in (bias or {}).items()]


def check_features(req: ChatCompletionRequest) -> None:
    """Cross-field checks of tools, tool messages, response_format and logit_bias."""
    names: set[str] = set()
    for i, tool in enumerate(req.tools or ()):
        if tool.function.name in names:
            raise InvalidRequest(
                f"tools[{i}].function.name {tool.function.name!r} is declared twice",
                param=f"tools[{i}].function.name",
            )
        names.add(tool.function.name)
        if tool.function.parameters is not None:
            _check_schema(tool.function.parameters, f"tools[{i}].function.parameters")
    choice = req.tool_choice
    if choice is not None and choice != "none" and not req.tools:
        raise InvalidRequest(
            "tool_choice is only allowed when tools are specified", param="tool_choice"
        )
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise InvalidRequest(
            f"tool_choice names function {choice.function.name!r}, which is not in tools",
            param="tool_choice",
        )
    calls: set[str] = set()
    for i, m in enumerate(req.messages):
        # As OpenAI: only an assistant message that calls tools may leave its content out.
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            needs = "unless it has tool_calls" if m.role == "assistant" else f"for role {m.role!r}"
            raise InvalidRequest(
                f"Missing required parameter: 'messages[{i}].content' ({needs}).",
                param=f"messages[{i}].content",
            )
        if m.tool_calls:
            if m.role != "assistant":
                raise InvalidRequest(
                    f"messages[{i}].tool_calls is only allowed on assistant messages",
                    param=f"messages[{i}].tool_calls",
                )
            calls.update(c.id for c in m.tool_calls)
        if m.role == "tool":
            if m.tool_call_id is None:
                raise InvalidRequest(
                    f"Missing required parameter: 'messages[{i}].tool_call_id'.",
                    param=f"messages[{i}].tool_call_id",
                )
            if m.tool_call_id not in calls:
                raise InvalidRequest(
                    f"Invalid parameter: messages with role 'tool' must be a response to a "
                    f"preceding message with 'tool_calls'; no call has id {m.tool_call_id!r}.",
                    param=f"messages[{i}].tool_call_id",
                )
    fmt = req.response_format
    if isinstance(fmt, JsonSchemaFormat):
        if fmt.json_schema.schema_ is None:
            raise InvalidRequest(
                "Missing required parameter: 'response_format.json_schema.schema'.",
                param="response_format.json_schema.schema",
            )
        _check_schema(fmt.json_schema.schema_, "response_format.json_schema.schema")
    check_logit_bias(req.logit_bias)
    if (
        req.min_tokens is not None
        and (cap := req.effective_max_tokens()) is not None
        and req.min_tokens > cap
    ):
        raise InvalidRequest(
            f"min_tokens ({req.min_tokens}) must not exceed max_tokens ({cap})",
            param="min_tokens",
        )


def now_s() -> int:
    return int(time.time())
