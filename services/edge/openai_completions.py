"""The OpenAI completions and embeddings requests, as the edge accepts them (pydantic).

As with chat (``openai_types``), a validation failure becomes one ``InvalidRequest`` whose
``param`` is the offending field's path; an input is named by its index (``input[3]``,
``prompt[1]``), which is what the OpenAI SDK shows users. Checks that depend on the deployment
(``suffix``, ``echo``, ``dimensions`` and which models embed) are the router's capability
filter's: a request no worker can serve gets a 400 naming the field from there.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from services.common import limits
from services.common.errors import InvalidRequest
from services.edge.openai_types import (
    A_NUMBER,
    MAX_LOGIT_BIAS,
    VALID_UNICODE,
    Flag,
    ModelName,
    Penalty,
    Probability,
    StreamOptions,
    a_number,
)

TokenId = Annotated[StrictInt, Field(ge=0, le=limits.MAX_TOKEN_ID)]
TokenIds = Annotated[list[TokenId], Field(max_length=limits.MAX_PROMPT_TOKEN_IDS)]
PromptText = Annotated[StrictStr, Field(max_length=limits.MAX_CONTENT_CHARS), VALID_UNICODE]

#: One prompt or input as the client may write it.
Prompt = PromptText | TokenIds


def prompts_of(value: Any) -> list[str | list[int]]:
    """``"text"`` | ``["a", "b"]`` | ``[1, 2, 3]`` | ``[[1, 2], [3]]`` → one entry per prompt.

    The four shapes OpenAI accepts, told apart by the first element; anything mixed is a 400
    naming the element (``prompt[2]``) — the caller renames it for embeddings (``input``)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise ValueError("must be a string, a list of strings, token ids or lists of token ids")
    if _is_token(value[0]):
        for i, x in enumerate(value):
            if not _is_token(x):
                raise _ElementError(
                    i, "must be a token id (an integer) like the elements before it"
                )
        return [list(value)]
    return list(value)


def _is_token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: ``max_tokens`` when a completions request leaves it out (OpenAI's and vLLM's default).
DEFAULT_MAX_TOKENS = 16


class _ElementError(ValueError):
    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


#: Chat-only request fields, refused by name on /v1/completions (a raw prompt has no tools,
#: no response format, no messages).
_CHAT_ONLY = (
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "response_format",
    "audio",
    "modalities",
    "prediction",
)


class CompletionRequest(BaseModel):
    """POST /v1/completions (OpenAI's legacy text completions)."""

    model_config = ConfigDict(extra="ignore")

    model: ModelName
    prompt: Any
    stream: Flag = False
    stream_options: StreamOptions | None = None
    # Left out: 16, as OpenAI's and vLLM's completions default; null: up to the context length.
    # 0 only with echo: the prompt and its logprobs, nothing generated (echo_only).
    max_tokens: Annotated[StrictInt, Field(ge=0, le=limits.MAX_TOKENS_CEILING)] | None = (
        DEFAULT_MAX_TOKENS
    )
    temperature: (
        Annotated[float, Field(ge=limits.TEMPERATURE_RANGE[0], le=limits.TEMPERATURE_RANGE[1])]
        | None
    ) = None
    top_p: Probability | None = None
    # Choices per prompt; the edge caps n with its --max-choices and prompts × n with
    # MAX_COMPLETION_CHOICES (each choice is its own worker stream).
    n: Annotated[StrictInt, Field(ge=1, le=limits.MAX_CHOICES)] | None = None
    # Only best_of == n (or unset): ranking extra candidates server-side is not done.
    best_of: Annotated[StrictInt, Field(ge=1, le=limits.MAX_CHOICES)] | None = None
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
    logprobs: Annotated[StrictInt, Field(ge=0, le=limits.MAX_TOP_LOGPROBS)] | None = None
    echo: StrictBool = False
    suffix: (
        Annotated[StrictStr, Field(max_length=limits.MAX_CONTENT_CHARS), VALID_UNICODE] | None
    ) = None
    user: Annotated[StrictStr, Field(max_length=256), VALID_UNICODE] | None = None
    logit_bias: (
        Annotated[dict[str, Annotated[float, A_NUMBER]], Field(max_length=MAX_LOGIT_BIAS)] | None
    ) = None
    ignore_eos: StrictBool = False

    @model_validator(mode="before")
    @classmethod
    def _no_chat_fields(cls, data: Any) -> Any:
        # Chat's fields on a raw prompt would be dropped without a word: name the first.
        if isinstance(data, dict):
            for name in _CHAT_ONLY:
                if data.get(name) is not None:  # raised as it is: pydantic wraps only ValueError
                    raise InvalidRequest(
                        f"Unsupported parameter: '{name}' is for /v1/chat/completions, "
                        "not /v1/completions.",
                        param=name,
                        code="unsupported_parameter",
                    )
        return data

    @model_validator(mode="after")
    def _zero_tokens_only_to_echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequest(
                "Invalid value for 'max_tokens': 0 is only supported with 'echo': true (the "
                "prompt and its logprobs, nothing generated); ask for at least 1 token.",
                param="max_tokens",
            )
        return self

    @model_validator(mode="after")
    def _best_of_is_n(self) -> CompletionRequest:
        if self.best_of is None or self.best_of == self.choices():
            return self
        if self.best_of < self.choices():
            raise InvalidRequest(
                f"Invalid value for 'best_of': {self.best_of} is less than 'n' "
                f"({self.choices()}); best_of must be greater than or equal to n.",
                param="best_of",
            )
        raise InvalidRequest(
            f"Unsupported value for 'best_of': {self.best_of} candidates for {self.choices()} "
            "choice(s); this deployment does not rank extra candidates server-side (as vLLM "
            "no longer does). Ask for 'n' choices with 'logprobs' and rank them yourself.",
            param="best_of",
            code="unsupported_value",
        )

    def choices(self) -> int:
        """Choices per prompt (OpenAI's ``n``)."""
        return self.n or 1

    @property
    def echo_only(self) -> bool:
        """``echo`` with ``max_tokens: 0``: the prompt scored, nothing generated (how
        lm-evaluation-harness and other scorers ask for a prompt's logprobs). The worker is
        asked for one token, as vLLM's own server does, and the edge drops it."""
        return self.echo and self.max_tokens == 0

    def worker_max_tokens(self) -> int | None:
        """``max_tokens`` as the worker gets it: at least 1 (see :attr:`echo_only`)."""
        return 1 if self.echo_only else self.max_tokens

    @field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _strict_number(cls, v: Any) -> Any:
        return a_number(v)

    def prompts(self, max_prompts: int) -> list[str | list[int]]:
        """The prompts, each checked (a 400 names ``prompt`` or ``prompt[i]``)."""
        return checked_inputs(self.prompt, "prompt", max_items=max_prompts, max_chars=None)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class EmbeddingRequest(BaseModel):
    """POST /v1/embeddings."""

    model_config = ConfigDict(extra="ignore")

    model: ModelName
    input: Any
    encoding_format: Annotated[
        Literal["float", "base64"], BeforeValidator(lambda v: "float" if v is None else v)
    ] = "float"
    dimensions: Annotated[StrictInt, Field(ge=1, le=65536)] | None = None
    user: Annotated[StrictStr, Field(max_length=256), VALID_UNICODE] | None = None


def checked_inputs(
    value: Any, param: str, *, max_items: int, max_chars: int | None
) -> list[str | list[int]]:
    """The prompts or inputs of a request, each non-empty and within bounds; a bad one is
    named by its index (``input[3]``), a bad whole by the field (``input``)."""
    try:
        items = prompts_of(value)
    except _ElementError as err:
        where = f"{param}[{err.index}]"
        raise InvalidRequest(f"Invalid value for '{where}': {err}.", param=where) from None
    except ValueError as err:
        raise InvalidRequest(f"Invalid value for '{param}': {err}.", param=param) from None
    if len(items) > max_items:
        raise InvalidRequest(
            f"'{param}' holds {len(items)} items; at most {max_items} are accepted.",
            param=param,
        )
    single = isinstance(value, str) or _is_token(value[0])  # one prompt, not a list of them
    if not single:
        # OpenAI's (and vLLM's) schema is a list of strings *or* a list of token-id lists.
        first_is_text = isinstance(items[0], str)
        for i, item in enumerate(items):
            if isinstance(item, (str, list)) and isinstance(item, str) is not first_is_text:
                raise InvalidRequest(
                    f"'{param}' must be a list of strings or a list of token-id lists, not both "
                    f"('{param}[0]' is {'a string' if first_is_text else 'a list'}, "
                    f"'{param}[{i}]' is {'a string' if isinstance(item, str) else 'a list'}).",
                    param=f"{param}[{i}]",
                )
    out: list[str | list[int]] = []
    for i, item in enumerate(items):
        where = param if single else f"{param}[{i}]"
        if isinstance(item, str):
            if not item:
                raise InvalidRequest(f"'{where}' must not be empty.", param=where)
            _check_text(item, where, max_chars)
        elif isinstance(item, list):
            if not item:
                raise InvalidRequest(f"'{where}' must not be empty.", param=where)
            if len(item) > limits.MAX_PROMPT_TOKEN_IDS:
                raise InvalidRequest(
                    f"'{where}' holds more than {limits.MAX_PROMPT_TOKEN_IDS} tokens.", param=where
                )
            for tok in item:
                if (
                    isinstance(tok, bool)
                    or not isinstance(tok, int)
                    or not 0 <= tok <= limits.MAX_TOKEN_ID
                ):
                    raise InvalidRequest(
                        f"'{where}' must hold token ids (integers 0..{limits.MAX_TOKEN_ID}).",
                        param=where,
                    )
        else:
            raise InvalidRequest(f"'{where}' must be a string or a list of token ids.", param=where)
        out.append(item)
    return out


def _check_text(text: str, where: str, max_chars: int | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(
            f"'{where}' contains an invalid Unicode escape (lone surrogate).", param=where
        ) from None
    limit = max_chars if max_chars is not None else limits.MAX_CONTENT_CHARS
    if len(text) > limit:
        raise InvalidRequest(
            f"'{where}' is {len(text)} characters long (at most {limit}).",
            param=where,
            code="input_too_long",
        )
