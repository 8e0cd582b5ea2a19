"""Tools and structured outputs on vLLM, with vLLM's own parts end to end.

Nothing here parses model output by hand. A request with tools or a ``response_format`` is
turned into vLLM's own OpenAI request model (``ChatCompletionRequest`` of its server), so:

- the worker's tool parser (``--tool-call-parser``, resolved once at start by vLLM's
  ``ParserManager``, which also checks the tokenizer has what the parser needs) adjusts the
  request as vLLM's server would: for ``required`` and named choices it sets the structured
  output (guided JSON over the call schema, or the parser's structural tag), so even a
  random-weight model returns calls that parse; and it keeps special tokens the parser reads;
- ``response_format`` becomes ``StructuredOutputsParams`` by vLLM's own mapping
  (``extract_structured_outputs``): ``json_object``, ``json_schema`` (its ``schema``);
- each streamed delta goes through the parser's ``parse_delta`` for the content, and the
  calls come from the parser's ``parse`` of the whole output when it ends (see
  :meth:`FeatureRequest.convert` for why), sent as ``ToolCallDelta`` pieces in OpenAI's
  incremental shape (index, id and name first, then arguments in pieces).

Errors before the first token name the field: a tool request on a worker without a parser is
``tools``; ``auto`` without ``--enable-auto-tool-choice`` is ``tool_choice``; a schema the
grammar backend cannot compile is ``response_format.json_schema.schema`` (or
``tools[i].function.parameters``) — see :func:`schema_error`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
from vllm.parser.abstract_parser import Parser
from vllm.parser.parser_manager import ParserManager
from vllm.sampling_params import StructuredOutputsParams
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

from services.common.errors import InvalidRequest
from services.worker.engine import (
    EngineConfigError,
    EngineRequest,
    FinishReason,
    ResponseFormat,
    ToolCallDelta,
)
from services.worker.vllm.config import VllmConfig

#: Tool-call arguments are sent in pieces of this many characters (OpenAI's stream shape).
ARGUMENT_PIECE_CHARS = 16


def check_engine_options(config: VllmConfig) -> None:
    """Names only vLLM knows, checked at start-up with the flag named."""
    parser = config.tool_call_parser
    if parser is not None and parser not in ToolParserManager.list_registered():
        known = ", ".join(ToolParserManager.list_registered())
        raise EngineConfigError(f"--tool-call-parser {parser}: unknown parser (known: {known})")
    if config.quantization is not None and config.quantization not in QUANTIZATION_METHODS:
        raise EngineConfigError(
            f"--quantization {config.quantization}: unknown method "
            f"(known: {', '.join(QUANTIZATION_METHODS)})"
        )


def load_parser(config: VllmConfig, tokenizer: Any) -> type[Parser] | None:
    """The worker's parser class (None without ``--tool-call-parser``); raises ValueError
    naming the flag when the model's tokenizer lacks what the parser needs."""
    if config.tool_call_parser is None:
        return None
    if config.tool_call_constraint == "json":
        # vLLM reads this when a parser class is defined (its lazy import, just below) and
        # when it builds a structural tag: off, required/named choices use guided JSON.
        os.environ["VLLM_ENFORCE_STRICT_TOOL_CALLING"] = "0"
    try:
        parser_cls = ParserManager.get_parser(
            tool_parser_name=config.tool_call_parser,
            enable_auto_tools=config.enable_auto_tool_choice,
            model_name=config.name,
            tool_strict_level=config.tool_strict_level,
            tokenizer=tokenizer,
        )
    except (TypeError, KeyError) as err:
        raise ValueError(f"--tool-call-parser {config.tool_call_parser}: {err}") from err
    tool_parser = getattr(parser_cls, "tool_parser_cls", None)
    if (
        config.tool_call_constraint == "json"
        and tool_parser is not None
        and not tool_parser.supports_required_and_named
    ):
        raise ValueError(
            f"--tool-call-constraint json: the {config.tool_call_parser} parser was loaded "
            "with structural tags earlier in this process; start the worker with it"
        )
    return parser_cls  # type: ignore[no-any-return]  # vllm is untyped here


def needs_features(request: EngineRequest) -> bool:
    """Whether this request takes the feature path (tools offered, or a JSON format)."""
    return bool(request.tools) or request.response_format.type != "text"


class FeatureRequest:
    """One request's vLLM-side state: the adjusted vLLM request, its parser (per request, as
    vLLM's server holds one), and what the sampling parameters must carry."""

    def __init__(
        self,
        request: EngineRequest,
        *,
        parser_cls: type[Parser] | None,
        enable_auto_tools: bool,
        tokenizer: Any,
        model_config: Any = None,
    ) -> None:
        self.mode = request.tool_choice.mode if request.tools else "none"
        if request.tools and self.mode != "none" and parser_cls is None:
            raise InvalidRequest(
                "this worker parses no tool calls (started without --tool-call-parser)",
                param="tools",
            )
        if request.tools and self.mode == "auto" and not enable_auto_tools:
            raise InvalidRequest(
                '"auto" tool choice needs a worker started with --enable-auto-tool-choice',
                param="tool_choice",
            )
        self.vllm_request = _vllm_request(request)
        self.parser: Parser | None = None
        if parser_cls is not None and request.tools:
            self.parser = parser_cls(tokenizer, self.vllm_request.tools, model_config=model_config)
            adjusted = self.parser.adjust_request(self.vllm_request)
            assert isinstance(adjusted, ChatCompletionRequest)
            self.vllm_request = adjusted
        self._parser_cls = parser_cls
        self._tokenizer = tokenizer
        self._model_config = model_config
        self._text: list[str] = []
        self._token_ids: list[int] = []
        self.calls = 0

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template renders them (OpenAI's shape)."""
        tools = self.vllm_request.tools
        return [t.model_dump(exclude_none=True) for t in tools] if tools else None

    def structured_outputs(self) -> StructuredOutputsParams | None:
        return self.vllm_request.extract_structured_outputs()

    @property
    def skip_special_tokens(self) -> bool:
        return bool(self.vllm_request.skip_special_tokens)

    def convert(
        self,
        text: str,
        token_ids: Sequence[int],
        prompt_ids: list[int],
        *,
        finished: bool,
    ) -> tuple[str, tuple[ToolCallDelta, ...]]:
        """One streamed delta → (content text, tool-call pieces).

        Content streams through the parser's ``parse_delta`` (text before and between calls;
        call markup held back). The calls themselves come from the parser's non-streaming
        ``parse`` of the whole output once it ends: vLLM 0.32's streaming ``hermes`` parser can
        leave the call's closing brace in the streamed arguments when one token closes both,
        while its whole-output parse is exact. They are then sent in OpenAI's incremental
        shape (id and name first, then the arguments in pieces), so clients assemble them as
        they would from any stream; what is lost is only that arguments arrive at the end.
        """
        if self.parser is None or self.mode == "none":
            return text, ()
        self._text.append(text)
        self._token_ids.extend(int(t) for t in token_ids)
        delta = self.parser.parse_delta(
            text, list(token_ids), self.vllm_request, prompt_ids, finished=finished
        )
        content = (delta.content or "") if delta is not None else ""
        return content, self._final_calls() if finished else ()

    def _final_calls(self) -> tuple[ToolCallDelta, ...]:
        assert self._parser_cls is not None
        parser = self._parser_cls(
            self._tokenizer, self.vllm_request.tools, model_config=self._model_config
        )
        # enable_auto_tools: this request may call tools (auto needs the flag, checked at
        # construction; required and named are parsed the same way by parsers whose call
        # format is enforced with a structural tag).
        _, _, calls = parser.parse(
            "".join(self._text),
            self.vllm_request,
            enable_auto_tools=True,
            model_output_token_ids=self._token_ids,
        )
        out: list[ToolCallDelta] = []
        for index, call in enumerate(calls or ()):
            out.append(
                ToolCallDelta(
                    index=index, id=call.id or f"call_{uuid.uuid4().hex[:24]}", name=call.name
                )
            )
            args = call.arguments or ""
            out.extend(
                ToolCallDelta(index=index, arguments=args[i : i + ARGUMENT_PIECE_CHARS])
                for i in range(0, len(args), ARGUMENT_PIECE_CHARS)
            )
        self.calls = len(calls or ())
        return tuple(out)

    def finish(self, reason: FinishReason) -> FinishReason:
        """OpenAI's finish reason: ``tool_calls`` when calls were made (auto, required);
        ``stop`` for a named function, as OpenAI does."""
        if self.calls and reason is FinishReason.STOP and self.mode in ("auto", "required"):
            return FinishReason.TOOL_CALLS
        return reason


def _response_format(fmt: ResponseFormat) -> dict[str, Any] | None:
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.type == "json_schema":
        spec: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.schema or {}}
        if fmt.strict:
            spec["strict"] = True
        return {"type": "json_schema", "json_schema": spec}
    return None


def _vllm_request(request: EngineRequest) -> ChatCompletionRequest:
    """vLLM's own request model for ``request``. For ``required`` and named choices every
    tool is sent ``strict`` (vLLM then pins the arguments to the tool's schema in the call's
    structural tag, not only the envelope): a forced call must be a valid one, whatever the
    model. For ``auto`` each tool's own ``strict`` decides, as in vLLM's server."""
    choice = request.tool_choice
    forced = choice.mode in ("required", "function")
    tool_choice: Any = choice.mode
    if choice.mode == "function":
        tool_choice = {"type": "function", "function": {"name": choice.function}}
    data: dict[str, Any] = {
        "model": request.model,
        "messages": [{"role": "user", "content": ""}],  # rendered separately (prompt.py)
        "stream": True,
        "response_format": _response_format(request.response_format),
    }
    if request.tools:
        data["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or None,
                    "parameters": t.parameters,
                    **({"strict": True} if t.strict or forced else {}),
                },
            }
            for t in request.tools
        ]
        data["tool_choice"] = tool_choice
        data["parallel_tool_calls"] = request.parallel_tool_calls
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        param = "tools" if where.startswith("tools") else "response_format"
        raise InvalidRequest(
            f"vLLM refuses {where or 'the request'}: {first['msg']}", param=param
        ) from None
    except ValueError as err:
        raise InvalidRequest(f"vLLM refuses the request: {err}", param="response_format") from err


def schema_error(request: EngineRequest, err: Exception) -> InvalidRequest:
    """A structured-output failure (the grammar backend could not compile the schema) as the
    400 naming the schema the client sent."""
    if request.response_format.type == "json_schema":
        param = "response_format.json_schema.schema"
    elif request.tools:
        index = next(
            (i for i, t in enumerate(request.tools) if t.name == request.tool_choice.function), 0
        )
        param = f"tools[{index}].function.parameters"
    else:
        param = "response_format"
    return InvalidRequest(
        f"the schema cannot be compiled: {err}", param=param, code="invalid_schema"
    )
