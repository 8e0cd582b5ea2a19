"""Tools and structured outputs on the real vLLM engine (CPU build, tiny random-weight model).

The model's weights are noise, so what these tests prove is what vLLM's structured outputs
guarantee: a named or ``required`` tool choice returns calls whose arguments validate against
the tool's schema, parsed by vLLM's ``hermes`` tool parser from the tiny model's Hermes-style
output; a ``json_schema`` response parses and validates; a schema the grammar backend cannot
compile fails before the first output, naming the schema's field.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import pytest_asyncio

from services.common.errors import InvalidRequest
from services.worker.engine import (
    ChatTurn,
    EngineOutput,
    EngineRequest,
    FinishReason,
    ResponseFormat,
    SamplingOptions,
    ToolChoice,
    ToolSpec,
)
from services.worker.vllm.config import VllmConfig
from services.worker.vllm.engine import VllmEngine
from tests.support.redis_proc import RedisProcess
from tests.vllm.inproc import VllmStack, start_vllm_stack

pytestmark = pytest.mark.vllm

NAME = "tiny-tools"
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "maximum": 7},
    },
    "required": ["city", "days"],
}
"""Small on purpose: the tiny model's byte-level tokenizer spends ~1 token per character of
the tool schema the chat template renders, and the context is 512 tokens."""
TOOLS = (ToolSpec(name="get_weather", parameters=WEATHER),)


def loads(text: str) -> object:
    """JSON as the grammar produced it. ``strict=False``: xgrammar lets a random model put raw
    control characters inside strings, which Python's strict parser refuses (JSON text
    parsers differ on this; OpenAI's clients use strict parsers — a known gap, README)."""
    return json.loads(text, strict=False)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tools_engine(tiny_model_dir: Path) -> AsyncIterator[VllmEngine]:
    base = VllmConfig.cpu_test(tiny_model_dir, served_model_name=NAME)
    config = VllmConfig(
        **{
            **{f: getattr(base, f) for f in base.__dataclass_fields__},
            "max_model_len": 512,
            "tool_call_parser": "hermes",
            "enable_auto_tool_choice": True,
            "structured_outputs_compact": True,
            "tool_call_constraint": "json",
            "structured_outputs_backend": "xgrammar",
        }
    )
    eng = VllmEngine(config)
    await eng.start()
    yield eng
    await eng.shutdown()


def request(rid: str, **over: object) -> EngineRequest:
    fields: dict[str, object] = {
        "request_id": rid,
        "model": NAME,
        "messages": (ChatTurn(role="user", content="Weather?"),),
        "sampling": SamplingOptions(max_tokens=280, temperature=0.0),
    }
    fields.update(over)
    return EngineRequest(**fields)  # type: ignore[arg-type]


async def collect(engine: VllmEngine, req: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(req)]


def assembled_calls(outputs: list[EngineOutput]) -> dict[int, dict[str, str]]:
    calls: dict[int, dict[str, str]] = {}
    for out in outputs:
        for d in out.tool_calls:
            call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            if d.id:
                call["id"], call["name"] = d.id, d.name
            call["arguments"] += d.arguments
    return calls


@pytest.mark.asyncio(loop_scope="session")
async def test_named_tool_choice_returns_a_call_that_validates(tools_engine: VllmEngine) -> None:
    outputs = await collect(
        tools_engine,
        request(
            "named", tools=TOOLS, tool_choice=ToolChoice(mode="function", function="get_weather")
        ),
    )
    calls = assembled_calls(outputs)
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    assert calls[0]["id"]
    jsonschema.validate(loads(calls[0]["arguments"]), WEATHER)
    assert outputs[-1].finish_reason is FinishReason.STOP  # named: "stop", as OpenAI


@pytest.mark.asyncio(loop_scope="session")
async def test_required_tool_choice_returns_calls_that_validate(tools_engine: VllmEngine) -> None:
    outputs = await collect(
        tools_engine,
        request(
            "required",
            tools=TOOLS,
            tool_choice=ToolChoice(mode="required"),
            parallel_tool_calls=False,
            sampling=SamplingOptions(max_tokens=280, temperature=0.0),
        ),
    )
    calls = assembled_calls(outputs)
    assert calls, "required: at least one call"
    for call in calls.values():
        assert call["name"] == "get_weather"
        jsonschema.validate(loads(call["arguments"]), WEATHER)
    assert outputs[-1].finish_reason is FinishReason.TOOL_CALLS


@pytest.mark.asyncio(loop_scope="session")
async def test_json_schema_output_parses_and_validates(tools_engine: VllmEngine) -> None:
    outputs = await collect(
        tools_engine,
        request(
            "schema",
            response_format=ResponseFormat(type="json_schema", schema=WEATHER, name="w"),
            sampling=SamplingOptions(max_tokens=280, temperature=0.0),
        ),
    )
    text = "".join(o.text for o in outputs)
    assert outputs[-1].finish_reason is FinishReason.STOP
    jsonschema.validate(loads(text), WEATHER)


@pytest.mark.asyncio(loop_scope="session")
async def test_json_object_output_is_a_json_object(tools_engine: VllmEngine) -> None:
    outputs = await collect(
        tools_engine,
        request(
            "object",
            response_format=ResponseFormat(type="json_object"),
            sampling=SamplingOptions(max_tokens=280, temperature=0.0),
        ),
    )
    if outputs[-1].finish_reason is FinishReason.STOP:  # noise may run to the length limit
        assert isinstance(loads("".join(o.text for o in outputs)), dict)
    else:
        assert "".join(o.text for o in outputs).lstrip().startswith("{")


@pytest.mark.asyncio(loop_scope="session")
async def test_an_uncompilable_schema_fails_before_the_first_output(
    tools_engine: VllmEngine,
) -> None:
    bad = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}
    with pytest.raises(InvalidRequest) as err:
        await collect(
            tools_engine,
            request("bad", response_format=ResponseFormat(type="json_schema", schema=bad)),
        )
    assert err.value.param == "response_format.json_schema.schema"
    # The engine is still fine afterwards.
    outputs = await collect(tools_engine, request("after", sampling=SamplingOptions(max_tokens=3)))
    assert outputs[-1].finish_reason is FinishReason.LENGTH


@pytest.mark.asyncio(loop_scope="session")
async def test_sampling_extensions_reach_vllm(tools_engine: VllmEngine) -> None:
    outputs = await collect(
        tools_engine,
        request(
            "extras",
            sampling=SamplingOptions(
                max_tokens=8,
                min_tokens=8,
                top_k=5,
                min_p=0.05,
                repetition_penalty=1.2,
                logit_bias=((1, -100.0),),
                stop_token_ids=(3,),
                seed=7,
            ),
        ),
    )
    assert outputs[-1].completion_tokens == 8
    assert 1 not in {t for o in outputs for t in o.token_ids}  # EOS banned by the bias


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [
        ("tool_call_parser", "no-such-parser", "--tool-call-parser no-such-parser"),
        ("quantization", "no-such-method", "--quantization no-such-method"),
    ],
)
def test_names_only_vllm_knows_are_checked_at_start_by_flag(
    field: str, value: str, flag: str
) -> None:
    from services.worker.engine import EngineConfigError
    from services.worker.vllm.features import check_engine_options

    with pytest.raises(EngineConfigError, match=flag):
        check_engine_options(VllmConfig(model="/m", **{field: value}))  # type: ignore[arg-type]
    check_engine_options(VllmConfig(model="/m", tool_call_parser="hermes", quantization="fp8"))


# -- the whole path: OpenAI SDK -> edge -> router -> worker -> vLLM ------------------------------

SDK_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": WEATHER},
    }
]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tools_stack(
    tools_engine: VllmEngine, redis_process: RedisProcess
) -> AsyncIterator[VllmStack]:
    s = await start_vllm_stack(tools_engine, redis_url=redis_process.url)
    yield s
    await s.stop()


@pytest.mark.asyncio(loop_scope="session")
async def test_the_sdk_gets_valid_forced_calls_and_json_through_the_stack(
    tools_stack: VllmStack,
) -> None:
    api = tools_stack.client
    messages: Any = [{"role": "user", "content": "Weather?"}]
    named = await api.chat.completions.create(
        model=NAME,
        messages=messages,
        tools=SDK_TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=280,
        temperature=0.0,
    )
    async with api.chat.completions.stream(
        model=NAME,
        messages=messages,
        tools=SDK_TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,  # a random model never closes a list of calls by itself
        max_tokens=280,
        temperature=0.0,
    ) as stream:
        required = await stream.get_final_completion()
    shaped = await api.chat.completions.create(
        model=NAME,
        messages=messages,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": WEATHER, "strict": True},
        },
        max_tokens=280,
        temperature=0.0,
    )
    for done in (named, required):
        calls = done.choices[0].message.tool_calls
        assert calls
        assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
        jsonschema.validate(loads(calls[0].function.arguments), WEATHER)  # type: ignore[union-attr]
    assert required.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(loads(shaped.choices[0].message.content or ""), WEATHER)
    with pytest.raises(openai.BadRequestError) as err:
        await api.chat.completions.create(
            model=NAME,
            messages=messages,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": {"$ref": "#/$defs/nowhere"}},
            },
        )
    assert err.value.param == "response_format.json_schema.schema"
