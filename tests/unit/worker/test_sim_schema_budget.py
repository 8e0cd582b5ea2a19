"""A hostile JSON schema costs SimEngine what the request's token budget allows, never more.

The script of a structured-output or tool-call request is built synchronously on the worker's
event loop when the request is admitted (services/worker/sim/jsongen.py). Before the budget,
``minLength: 1e9`` kept the loop at 100 % CPU for good, ``minItems: 1e8`` grew memory without
end and a ``$ref`` fan-out did 10^8 values' work. Each test here would hang or fail without
the budget; the ``timeout`` marks (signal-based, so they interrupt a synchronous loop) only
stop a regression from hanging the suite — the assertions are about the output.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import pytest

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
from services.worker.sim import jsongen
from services.worker.sim.config import SimConfig
from services.worker.sim.engine import SimEngine
from services.worker.sim.script import build_script
from services.worker.sim.text import split_pieces

FAST = SimConfig(time_scale=0.01)
GUARD = pytest.mark.timeout(60, method="signal")

BILLION_CHARS: dict[str, Any] = {"type": "string", "minLength": 1_000_000_000}
HUNDRED_MILLION_ITEMS: dict[str, Any] = {"type": "array", "minItems": 100_000_000}
BILLION_PROPERTIES: dict[str, Any] = {"type": "object", "minProperties": 1_000_000_000}
# Ten properties that each $ref the root: 10^8 values at the generator's depth limit.
FAN_OUT: dict[str, Any] = {"type": "object", "properties": {k: {"$ref": "#"} for k in "abcdefghij"}}
# 2000 models of 50 distinct fields merged by allOf: 10^8 dict copies to resolve.
_MODELS = {
    f"m{i}": {"type": "object", "properties": {f"f{i}_{j}": {"type": "integer"} for j in range(50)}}
    for i in range(2000)
}
UNRESOLVABLE: dict[str, Any] = {
    "$defs": _MODELS,
    "allOf": [{"$ref": f"#/$defs/m{i}"} for i in range(2000)],
}
# A billion-character match, and a billion repeats of nothing (writes no character at all).
LONG_MATCH: dict[str, Any] = {"type": "string", "pattern": "^(?:ab){1000000000}$"}
EMPTY_REPEATS: dict[str, Any] = {
    "type": "array",
    "minItems": 100,
    "items": {"type": "string", "pattern": "^(?:){1000000000}x$"},
}
HOSTILE = [
    BILLION_CHARS,
    HUNDRED_MILLION_ITEMS,
    BILLION_PROPERTIES,
    FAN_OUT,
    UNRESOLVABLE,
    LONG_MATCH,
    EMPTY_REPEATS,
]
HOSTILE_IDS = [
    "minLength",
    "minItems",
    "minProperties",
    "ref-fan-out",
    "allOf-blowup",
    "pattern-length",
    "pattern-empty-repeats",
]


def structured(request_id: str, schema: dict[str, Any], **sampling: Any) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        model="meridian-sim",
        messages=(ChatTurn(role="user", content="Answer in JSON."),),
        sampling=SamplingOptions(**sampling),
        response_format=ResponseFormat(type="json_schema", schema=schema),
    )


def tool_request(text: str, *tools: ToolSpec, **over: Any) -> EngineRequest:
    fields: dict[str, Any] = {
        "request_id": "t",
        "model": "meridian-sim",
        "messages": (ChatTurn(role="user", content=text),),
        "tools": tools,
    }
    fields.update(over)
    return EngineRequest(**fields)


@pytest.fixture
async def engine() -> AsyncIterator[SimEngine]:
    e = SimEngine(FAST)
    await e.start()
    yield e
    await e.shutdown()


async def collect(e: SimEngine, request: EngineRequest) -> list[EngineOutput]:
    return [out async for out in e.generate(request)]


# -- through the engine -----------------------------------------------------------------------


@GUARD
async def test_a_schema_demanding_a_billion_characters_ends_within_the_token_budget(
    engine: SimEngine,
) -> None:
    outs = await collect(engine, structured("big", BILLION_CHARS, max_tokens=64))
    final = outs[-1]
    assert final.finish_reason is FinishReason.LENGTH
    assert final.completion_tokens == sum(len(o.token_ids) for o in outs) == 64
    text = "".join(o.text for o in outs)
    assert text.startswith('"')
    assert len(text) <= 64 * 13  # 64 tokens of at most 12 letters and a space
    # The worker is still serving: a plain request right after it completes.
    plain = EngineRequest("next", "meridian-sim", (ChatTurn("user", "hi"),), SamplingOptions())
    assert (await collect(engine, plain))[-1].finish_reason is FinishReason.STOP


@GUARD
@pytest.mark.parametrize("schema", HOSTILE, ids=HOSTILE_IDS)
async def test_a_hostile_schema_finishes_with_length_without_exceeding_max_tokens(
    engine: SimEngine, schema: dict[str, Any]
) -> None:
    outs = await collect(engine, structured("h", schema, max_tokens=40))
    assert outs[-1].finish_reason is FinishReason.LENGTH
    assert 1 <= outs[-1].completion_tokens <= 40


@GUARD
async def test_without_max_tokens_a_hundred_million_items_end_at_the_context_length() -> None:
    small = SimEngine(SimConfig(time_scale=0.01, max_model_len=256))
    await small.start()
    try:
        outs = await collect(small, structured("nomax", HUNDRED_MILLION_ITEMS))
    finally:
        await small.shutdown()
    final = outs[-1]
    assert final.finish_reason is FinishReason.LENGTH
    assert final.prompt_tokens + final.completion_tokens == 256


@GUARD
async def test_cancelling_a_hostile_structured_stream_frees_its_slot(engine: SimEngine) -> None:
    started = asyncio.Event()

    async def read() -> None:
        async for _ in engine.generate(structured("c", BILLION_CHARS, max_tokens=5000)):
            started.set()

    task = asyncio.create_task(read())
    # Bounded: were the script's build interrupted by the guard, the stream would never start.
    await asyncio.wait_for(started.wait(), timeout=30)
    assert engine.load().running == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    load = engine.load()
    assert (load.running, load.waiting, load.kv_cache_usage) == (0, 0, 0.0)


# -- the script ---------------------------------------------------------------------------------


@GUARD
@pytest.mark.parametrize("schema", HOSTILE, ids=HOSTILE_IDS)
def test_a_script_is_never_longer_than_max_tokens(schema: dict[str, Any]) -> None:
    script = build_script(structured("s", schema), seed=1, max_tokens=25)
    assert script is not None
    assert 1 <= len(script) <= 25
    assert script.finish is FinishReason.LENGTH


@GUARD
def test_a_tool_call_that_does_not_fit_finishes_with_length_and_no_later_call_is_made() -> None:
    huge = ToolSpec(
        name="upload",
        parameters={
            "type": "object",
            "properties": {"blob": BILLION_CHARS},
            "required": ["blob"],
        },
    )
    small = ToolSpec(name="get_time", parameters={"type": "object", "properties": {}})
    script = build_script(tool_request("upload then get_time", huge, small), 1, max_tokens=30)
    assert script is not None
    assert len(script) == 30
    assert script.finish is FinishReason.LENGTH
    assert script.call_names == ["upload"]
    arguments = "".join(step.piece for step in script.steps)
    assert arguments.startswith('{"blob": "')


def test_tool_calls_that_fit_keep_their_finish_reason() -> None:
    tool = ToolSpec(name="get_time", parameters={"type": "object", "properties": {}})
    named = ToolChoice(mode="function", function="get_time")
    auto = build_script(tool_request("get_time", tool), 1, max_tokens=1000)
    exact = build_script(tool_request("get_time", tool, tool_choice=named), 1, max_tokens=1000)
    assert auto is not None
    assert auto.finish is FinishReason.TOOL_CALLS
    assert exact is not None
    assert exact.finish is FinishReason.STOP
    # A budget of exactly the arguments' length still completes the call.
    fitted = build_script(tool_request("get_time", tool), 1, max_tokens=len(auto))
    assert fitted is not None
    assert fitted.finish is FinishReason.TOOL_CALLS


# -- the generator ------------------------------------------------------------------------------


PEOPLE: dict[str, Any] = {
    "type": "array",
    "minItems": 40,
    "maxItems": 40,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 30},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
        },
        "required": ["name", "age"],
    },
}


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 50, 333])
def test_a_truncated_document_is_a_prefix_of_the_complete_one(max_tokens: int) -> None:
    whole = jsongen.render(PEOPLE, 5, max_tokens=1 << 16)
    cut = jsongen.render(PEOPLE, 5, max_tokens=max_tokens)
    assert whole.complete
    assert not cut.complete
    assert whole.text.startswith(cut.text)
    assert len(split_pieces(cut.text)) > max_tokens  # enough for max_tokens exact tokens


def test_a_document_that_fits_is_the_unbounded_one() -> None:
    rendering = jsongen.render(PEOPLE, 5, max_tokens=1 << 16)
    assert rendering.text == json.dumps(jsongen.generate(PEOPLE, 5), ensure_ascii=False)
    jsonschema.validate(json.loads(rendering.text), PEOPLE)


@GUARD
def test_generate_refuses_an_instance_larger_than_its_budget() -> None:
    with pytest.raises(jsongen.InstanceTooLarge):
        jsongen.generate(BILLION_CHARS, 1)


@GUARD
@pytest.mark.parametrize(
    "schema",
    [
        {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
        {"allOf": [{"$ref": "#"}]},
        {"type": "object", "properties": {"x": {"type": "integer"}}, "allOf": [{"$ref": "#"}]},
        {"oneOf": [{"oneOf": [{"$ref": "#"}]}]},
    ],
    ids=["anyOf-cycle", "allOf-root", "allOf-root-with-properties", "oneOf-cycle"],
)
def test_combinators_that_include_themselves_terminate(schema: dict[str, Any]) -> None:
    rendering = jsongen.render(schema, 3, max_tokens=100)
    assert rendering.complete
    json.loads(rendering.text)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "minLength": "many", "maxLength": None},
        {"type": "value"},  # names a method of the generator, not a type
        {"type": "normalize"},
        {"anyOf": [True]},
        {"allOf": [True, {"type": "integer"}]},
        {"type": "object", "required": [["not", "a", "name"], "ok"]},
        {"type": "object", "properties": ["x"], "minProperties": "2"},
        {"type": "array", "prefixItems": {"x": 1}, "minItems": float("nan")},
        {"type": "integer", "minimum": "0", "maximum": float("inf")},
        {"type": "number", "minimum": -1e308, "maximum": 1e308},
    ],
)
def test_keywords_of_the_wrong_type_are_ignored_not_fatal(schema: dict[str, Any]) -> None:
    rendering = jsongen.render(schema, 1, max_tokens=100)
    assert rendering.complete
    json.loads(rendering.text)  # strict JSON: no NaN or Infinity either


@GUARD
def test_unique_items_of_a_long_array_keep_json_equality() -> None:
    schema = {
        "type": "array",
        "minItems": 3,
        "maxItems": 3,
        "uniqueItems": True,
        "items": {"enum": [{"a": 1, "b": 2}, {"b": 2, "a": 1}]},
    }
    value = jsongen.generate(schema, 2)
    assert len(value) == 3
    # One object: the other key order is the same JSON value (padding words fill the rest).
    assert sum(isinstance(v, dict) for v in value) == 1
    jsonschema.validate(value, {**schema, "items": True})
    # Ten thousand distinct items: deduplication is linear, not pairwise.
    uuids = {"type": "string", "format": "uuid"}
    wide = {"type": "array", "minItems": 10_000, "uniqueItems": True, "items": uuids}
    many = jsongen.generate(wide, 1)
    assert len(many) == len(set(many)) == 10_000
