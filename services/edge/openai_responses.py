"""POST /v1/responses (OpenAI's Responses API), as the edge accepts it.

A Responses request is a chat request in other words: ``instructions`` are the system
message, ``input`` items are the conversation (messages, the model's earlier function calls
and their outputs), ``text.format`` is the response format, ``max_output_tokens`` the token
budget. So the edge translates it into a :class:`~services.edge.openai_types.ChatCompletionRequest`
once, at validation, and from there it is routed, admitted, streamed, failed over and migrated
exactly as chat is; only the answer is rendered in the Responses shape
(services/edge/render_response.py). A 400 names the Responses field, not the chat one it
became (:func:`responses_param`).

Stored responses (``store``, on by default as on OpenAI's) live in the edge's Redis
(services/edge/responses_store.py): ``previous_response_id`` goes on from one — its
conversation, then this input; its ``instructions`` are not carried over, as on OpenAI's.
What needs more than that (``conversation`` objects, stored ``prompt`` templates,
``background``, ``item_reference`` items) is a 400 that says to send the conversation as
``input`` instead. Built-in tools (web search, file search, code interpreter, ...) are
OpenAI's hosted services and are refused by name; function tools are served.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)

from services.common import limits
from services.common.errors import InvalidRequest
from services.edge.openai_types import (
    VALID_UNICODE,
    Flag,
    Metadata,
    ModelName,
    Probability,
    a_number,
)

#: Fields that need state this service does not keep.
_NEEDS_STORAGE = {
    "conversation": "conversations are not stored here; send the whole conversation as 'input'",
    "prompt": "stored prompt templates are not offered here; send the text as 'instructions'",
}

#: Input item types that are OpenAI's hosted tools' results, not a model's conversation.
_MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_UNSUPPORTED_PARTS = {
    "input_image": "images",
    "input_file": "files",
    "input_audio": "audio",
}
#: How much of a (long) include list is read: more cannot name more than the known values.
MAX_INCLUDE = 16
_LOGPROBS_INCLUDE = "message.output_text.logprobs"
_KNOWN_INCLUDE = frozenset(
    {
        _LOGPROBS_INCLUDE,
        "reasoning.encrypted_content",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
    }
)


class JsonSchemaTextFormat(BaseModel):
    """``text.format`` of type ``json_schema``: flat, unlike chat's ``json_schema`` object."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["json_schema"]
    name: StrictStr
    description: StrictStr | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: StrictBool | None = None


class PlainTextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object"]


class TextParam(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: (
        Annotated[JsonSchemaTextFormat | PlainTextFormat, Field(discriminator="type")] | None
    ) = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(BaseModel):
    """The Responses fields the edge reads; ``input``, ``tools`` and ``tool_choice`` are
    checked item by item as they are translated (:func:`chat_body`)."""

    # Unknown fields are ignored, as for chat: SDKs and proxies add their own.
    model_config = ConfigDict(extra="ignore")

    model: ModelName
    input: Any = None
    instructions: (
        Annotated[StrictStr, Field(max_length=limits.MAX_CONTENT_CHARS), VALID_UNICODE] | None
    ) = None
    max_output_tokens: Annotated[StrictInt, Field(ge=1, le=limits.MAX_TOKENS_CEILING)] | None = None
    temperature: (
        Annotated[float, Field(ge=limits.TEMPERATURE_RANGE[0], le=limits.TEMPERATURE_RANGE[1])]
        | None
    ) = None
    top_p: Probability | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=limits.MAX_TOP_LOGPROBS)] | None = None
    include: Annotated[list[StrictStr], Field(max_length=MAX_INCLUDE)] | None = None
    stream: Flag = False
    tools: Annotated[list[Any], Field(max_length=128)] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    text: TextParam | None = None
    store: StrictBool | None = None
    background: StrictBool | None = None
    metadata: Metadata | None = None
    user: Annotated[StrictStr, Field(max_length=256), VALID_UNICODE] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    prompt_cache_key: Any = None  # checked as chat's (the chat request it becomes carries it)
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    reasoning: dict[str, Any] | None = None
    previous_response_id: Annotated[StrictStr, Field(max_length=128)] | None = None
    # Meridian extension, as chat's: reproducible sampling.
    seed: Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)] | None = None

    @field_validator("temperature", "top_p", mode="before")
    @classmethod
    def _strict_number(cls, v: Any) -> Any:
        return a_number(v)  # "0.5" is a client bug

    def logprobs_included(self) -> bool:
        return _LOGPROBS_INCLUDE in (self.include or ())


def check_unsupported(data: dict[str, Any]) -> None:
    """A 400 naming the first field that needs a stored response (see the module docstring)."""
    for name, instead in _NEEDS_STORAGE.items():
        if data.get(name) is not None:
            raise InvalidRequest(
                f"Unsupported parameter: '{name}' is not supported; {instead}.",
                param=name,
                code="unsupported_parameter",
            )
    if data.get("background") is True:
        raise InvalidRequest(
            "Unsupported value for 'background': responses are not run in the background "
            "here; send the request without it (stream it to see it progress).",
            param="background",
            code="unsupported_value",
        )


#: The ids this edge gives responses (``resp_`` and 32 hex digits); any other id cannot have
#: been stored here, and is not looked up.
RESPONSE_ID = re.compile(r"^resp_[0-9a-f]{32}$")


@dataclass(slots=True)
class ResponsesTurn:
    """One Responses request as the pipeline carries it (``ChatContext.responses``): the
    request, the conversation it goes on from and this turn's input, as chat messages (what
    is stored for the next turn) and as the client's items (``/input_items``)."""

    req: ResponsesRequest
    previous: list[dict[str, Any]] = field(default_factory=list)
    input_messages: list[dict[str, Any]] = field(default_factory=list)
    #: Whether the chat request still waits for the previous response (read from Redis).
    pending: bool = False
    raw_bytes: int = 0  # the request body's size
    previous_bytes: int = 0  # the stored record it goes on from, encoded

    def input_items(self, response_id: str) -> list[dict[str, Any]]:
        """This turn's input as Responses items, each with an id (as OpenAI lists them)."""
        value = self.req.input
        items: list[Any] = (
            [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": value}],
                }
            ]
            if isinstance(value, str)
            else list(value or [])
        )
        suffix = response_id.removeprefix("resp_")
        out = []
        for i, item in enumerate(items):
            item = dict(item)
            item.setdefault("type", "message")
            item.setdefault("id", f"item_{suffix}_{i}")
            if item["type"] in _ITEMS_WITH_STATUS:
                item.setdefault("status", "completed")
            content = item.get("content")
            if item["type"] == "message" and isinstance(content, str):
                kind = "output_text" if item.get("role") == "assistant" else "input_text"
                content = [{"type": kind, "text": content}]
            if item["type"] == "message" and isinstance(content, list):
                item["content"] = [
                    {**part, "annotations": part.get("annotations", [])}
                    if isinstance(part, dict) and part.get("type") == "output_text"
                    else part
                    for part in content
                ]
            out.append(item)
        return out


#: The input items OpenAI lists with a ``status`` (done, once the turn is stored).
_ITEMS_WITH_STATUS = frozenset({"message", "function_call", "function_call_output"})


#: Responses fields that are chat fields of the same name and meaning.
_PASSED_AS_IS = (
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "seed",
    "truncation",
    "prompt_cache_key",
)


def chat_body(req: ResponsesRequest, turn: ResponsesTurn | None = None) -> dict[str, Any]:
    """The chat request ``req`` means, as a JSON object for chat's own validation; ``turn``
    (when given) gets this turn's input messages and supplies the earlier conversation."""
    for name in req.include or ():
        if name not in _KNOWN_INCLUDE:
            raise InvalidRequest(
                f"Invalid value for 'include': {name!r} is not a known include value.",
                param="include",
            )
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    current = _input_messages(req.input)
    previous = turn.previous if turn is not None else []
    if not current and not previous:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    if turn is not None:
        turn.input_messages = current
    messages.extend(previous)
    messages.extend(current)
    _check_every_call_answered(messages)
    body: dict[str, Any] = {"model": req.model, "messages": messages, "stream": req.stream}
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    for name in _PASSED_AS_IS:
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    if req.logprobs_included() or req.top_logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = req.top_logprobs or 0
    if req.tools:
        body["tools"] = [_function_tool(t, i) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None and (req.tools or req.tool_choice not in ("auto", "none")):
        # "auto" / "none" with no tools say nothing (every response echoes "auto"; a client
        # replaying one must not be refused); chat refuses a tool_choice without tools.
        body["tool_choice"] = _tool_choice(req.tool_choice)
    fmt = req.text.format if req.text is not None else None
    if isinstance(fmt, JsonSchemaTextFormat):
        spec: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_}
        if fmt.description is not None:
            spec["description"] = fmt.description
        if fmt.strict is not None:
            spec["strict"] = fmt.strict
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    return body


def _check_every_call_answered(messages: list[dict[str, Any]]) -> None:
    """As OpenAI's: a function call in the conversation (this input's or a stored turn's)
    needs its ``function_call_output``. Without one the model would be shown a call that
    never returned, and chat templates render that differently (some not at all); a client
    that forgot to send an output is told so instead. (An output without its call is refused
    by chat's own check, in chat's terms translated back.)"""
    answered = {m.get("tool_call_id") for m in messages if m["role"] == "tool"}
    for m in messages:
        for call in m.get("tool_calls") or ():
            if call["id"] not in answered:
                raise InvalidRequest(
                    f"No tool output found for function call {call['id'][:128]}.",
                    param="input",
                )


def _input_messages(value: Any) -> list[dict[str, Any]]:
    """``input`` (a string, or a list of items) → chat messages. A model's function calls
    join the assistant message before them, as chat's ``tool_calls``; their outputs are
    ``tool`` messages. Reasoning items are the model's own (none come from here) and are
    left out."""
    if value is None:
        return []
    if isinstance(value, str):
        if not value:
            raise InvalidRequest("Invalid value for 'input': it is empty.", param="input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise InvalidRequest(
            "Invalid type for 'input': expected a string or a list of input items.",
            param="input",
        )
    if len(value) > limits.MAX_MESSAGES:
        raise InvalidRequest(
            f"Too many input items: {len(value)} (at most {limits.MAX_MESSAGES}).",
            param="input",
        )
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"Invalid type for '{where}': expected an object.", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where, empty=True),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item, "call_id", where),
                    "content": _output_text(item.get("output"), f"{where}.output"),
                }
            )
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            raise InvalidRequest(
                f"Unsupported value for '{where}.type': 'item_reference' items are not "
                "looked up here; send the item itself, or go on with previous_response_id.",
                param=f"{where}.type",
                code="unsupported_value",
            )
        elif isinstance(kind, str):
            raise InvalidRequest(
                f"Unsupported value for '{where}.type': {kind[:64]!r}; this deployment takes "
                "messages, function_call and function_call_output items.",
                param=f"{where}.type",
                code="unsupported_value",
            )
        else:
            raise InvalidRequest(
                f"Missing required parameter: '{where}.type' (or a 'role').", param=f"{where}.type"
            )
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _MESSAGE_ROLES:
        raise InvalidRequest(
            f"Invalid value for '{where}.role': expected one of 'user', 'system', 'developer', "
            "'assistant'.",
            param=f"{where}.role",
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list) or not content:
        raise InvalidRequest(
            f"Invalid value for '{where}.content': expected a string or a non-empty list of "
            "content parts.",
            param=f"{where}.content",
        )
    if len(content) > 64:
        raise InvalidRequest(
            f"Too many content parts in '{where}.content': {len(content)} (at most 64).",
            param=f"{where}.content",
        )
    parts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            kind = None  # a list or an object is no part type (and cannot be looked up)
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": _string(part, "text", at, empty=True)})
        elif kind == "refusal":
            parts.append({"type": "text", "text": _string(part, "refusal", at, empty=True)})
        elif kind in _UNSUPPORTED_PARTS:
            raise InvalidRequest(
                f"Unsupported value for '{at}.type': {kind!r}; the models here read text, not "
                f"{_UNSUPPORTED_PARTS[kind]}.",
                param=f"{at}.type",
                code="unsupported_value",
            )
        else:
            raise InvalidRequest(
                f"Invalid value for '{at}.type': expected 'input_text' or 'output_text'.",
                param=f"{at}.type",
            )
    return {"role": role, "content": parts}


def _output_text(value: Any, where: str) -> str:
    """A function call's output: a string, or a list of text parts (joined)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)
        for p in value
    ):
        return "".join(p["text"] for p in value)
    raise InvalidRequest(
        f"Invalid value for '{where}': expected a string or a list of input_text parts.",
        param=where,
    )


def _string(item: dict[str, Any], key: str, where: str, *, empty: bool = False) -> str:
    value = item.get(key)
    if value is None:
        raise InvalidRequest(
            f"Missing required parameter: '{where}.{key}'.", param=f"{where}.{key}"
        )
    if not isinstance(value, str) or (not value and not empty):
        raise InvalidRequest(
            f"Invalid value for '{where}.{key}': expected a non-empty string.",
            param=f"{where}.{key}",
        )
    return value


def _function_tool(tool: Any, i: int) -> dict[str, Any]:
    """A Responses function tool (flat: ``name``, ``parameters``, ...) → chat's nested one."""
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise InvalidRequest(f"Invalid type for '{where}': expected an object.", param=where)
    kind = tool.get("type")
    if kind != "function":
        raise InvalidRequest(
            f"Unsupported value for '{where}.type': {str(kind)[:64]!r}; OpenAI's hosted tools "
            "are not offered here, function tools are.",
            param=f"{where}.type",
            code="unsupported_value",
        )
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    if "name" not in function:
        raise InvalidRequest(f"Missing required parameter: '{where}.name'.", param=f"{where}.name")
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice  # "none" | "auto" | "required": chat's validation checks the word
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise InvalidRequest(
        "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
        '{"type": "function", "name": ...}.',
        param="tool_choice",
    )


_CHAT_TO_RESPONSES = (
    (re.compile(r"^max_(completion_)?tokens$"), "max_output_tokens"),
    (re.compile(r"^text\.format\.json_schema\."), "text.format."),  # the union's tag
    (re.compile(r"^text\.format\.(text|json_object)\."), "text.format."),
    (re.compile(r"^response_format\.json_schema\.schema"), "text.format.schema"),
    (re.compile(r"^response_format\.json_schema"), "text.format"),
    (re.compile(r"^response_format"), "text.format"),
    (re.compile(r"^tools\[(\d+)\]\.function"), r"tools[\1]"),
    (re.compile(r"^tool_choice\.function"), "tool_choice"),
    (re.compile(r"^messages.*"), "input"),
    (re.compile(r"^logprobs"), "include"),
)


def responses_param(param: str | None) -> str | None:
    """A chat field's name as the Responses request called it (``tools[0].function.parameters``
    → ``tools[0].parameters``; messages → ``input``, whose items are not one-to-one)."""
    if param is None:
        return None
    for pattern, replacement in _CHAT_TO_RESPONSES:
        if pattern.match(param):
            return pattern.sub(replacement, param, count=1)
    return param


def in_responses_terms(err: InvalidRequest) -> InvalidRequest:
    """``err``, raised about the chat request a Responses request became (by chat's
    validation, the router's capability check, a worker), naming the Responses field."""
    param = responses_param(err.param)
    if param == err.param:
        return err
    message = err.message.replace(f"'{err.param}'", f"'{param}'")
    return type(err)(message, param=param, code=err.code, retry_after_s=err.retry_after_s)
