"""SimEngine's stand-ins for tools and structured outputs: schema instances that validate,
and the documented rule for when it calls which tool (services/worker/sim/script.py)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from services.worker.engine import (
    ChatTurn,
    EngineRequest,
    FinishReason,
    ResponseFormat,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
)
from services.worker.sim import jsongen
from services.worker.sim.engine import merge_tool_calls
from services.worker.sim.script import build_script, planned_calls
from tests.support.recursive_models import Chain, Thread, Tree


class Address(BaseModel):
    street: str
    zip: str | None = None


class Person(BaseModel):
    name: str
    age: int
    tags: list[str]
    home: Address
    friends: list[Address] = []


RECURSIVE: list[dict[str, Any]] = [
    Tree.model_json_schema(),
    Chain.model_json_schema(),
    Thread.model_json_schema(),
    # The same by hand: a nullable "type" list, recursion through $defs.
    {
        "$defs": {
            "node": {
                "type": ["object", "null"],
                "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                "required": ["v", "next"],
            }
        },
        "$ref": "#/$defs/node",
    },
    # A union whose recursive branch comes first (pydantic's Expr = BinOp | int): a minimal
    # level takes the scalar.
    {
        "$defs": {
            "BinOp": {
                "type": "object",
                "properties": {
                    "op": {"enum": ["+", "-"]},
                    "left": {"$ref": "#/$defs/Expr"},
                    "right": {"$ref": "#/$defs/Expr"},
                },
                "required": ["op", "left", "right"],
            },
            "Expr": {"anyOf": [{"$ref": "#/$defs/BinOp"}, {"type": "integer"}]},
        },
        "$ref": "#/$defs/Expr",
    },
    # An array of itself: minimal levels are empty arrays.
    {"type": "array", "items": {"$ref": "#"}},
]


SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 3, "maximum": 5}}},
    {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "minItems": 2},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "email"},
    {"type": ["number", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
    {"allOf": [{"properties": {"a": {"type": "string"}}}, {"required": ["a"]}]},
    {"type": "object", "properties": {}, "additionalProperties": False},
    {"type": "integer", "multipleOf": 5, "minimum": 11, "maximum": 40},
    {"type": "string", "minLength": 30, "maxLength": 31},
    {"const": {"fixed": [1, 2]}},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2},
    Person.model_json_schema(),
    {"type": "string", "pattern": r"^[A-Z]{3}-\d{4}$"},
    {"type": "string", "pattern": r"^[a-z]+(?:-[a-z]+)*$", "minLength": 12, "maxLength": 16},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[str(i) for i in range(len(SCHEMAS))])
@pytest.mark.parametrize("seed", [0, 1, 2, 99])
def test_generated_instances_validate_against_their_schema(
    schema: dict[str, Any], seed: int
) -> None:
    value = jsongen.generate(schema, seed)
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    json.dumps(value)  # and it is JSON


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@pytest.mark.parametrize("schema", RECURSIVE, ids=[str(i) for i in range(len(RECURSIVE))])
@pytest.mark.parametrize("seed", range(8))
def test_recursive_schemas_end_in_a_valid_instance(schema: dict[str, Any], seed: int) -> None:
    value = jsongen.generate(schema, seed)
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    assert _depth(value) <= jsongen.MAX_DEPTH + 2  # minimal levels stop at once


@pytest.mark.parametrize("model", [Tree, Chain, Thread])
def test_recursive_pydantic_models_parse_what_the_generator_writes(model: type[BaseModel]) -> None:
    # What client.chat.completions.parse(response_format=model) does with the answer.
    for seed in range(8):
        text = jsongen.render(model.model_json_schema(), seed, max_tokens=4096)
        assert text.complete
        model.model_validate_json(text.text)


def test_a_recursive_instance_is_full_above_the_depth_limit() -> None:
    chain = jsongen.generate(Chain.model_json_schema(), 3)
    links = 0
    while chain is not None:
        links += 1
        chain = chain["next"]
    # Full levels follow the non-null branch; the first minimal level ends the chain.
    assert links == jsongen.MAX_DEPTH


def test_a_schema_that_requires_itself_is_cut_at_the_cut_depth() -> None:
    endless = {"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]}
    value = jsongen.generate(endless, 0)
    assert _depth(value) == jsongen.CUT_DEPTH + 1  # no finite instance; it stops anyway


def test_the_same_seed_gives_the_same_document() -> None:
    schema = Person.model_json_schema()
    assert jsongen.generate(schema, 7) == jsongen.generate(schema, 7)
    Person.model_validate(jsongen.generate(schema, 7))


WEATHER = ToolSpec(name="get_weather", parameters={"type": "object", "properties": {}})
TIME = ToolSpec(name="get_time")


def req(text: str, *, role: str = "user", **over: Any) -> EngineRequest:
    fields: dict[str, Any] = {
        "request_id": "r",
        "model": "m",
        "messages": (ChatTurn(role=role, content=text),),
        "tools": (WEATHER, TIME),
    }
    fields.update(over)
    return EngineRequest(**fields)


@pytest.mark.parametrize(
    ("request_", "called"),
    [
        (req("no tool here"), []),
        (req("use GET_TIME then get_weather"), ["get_time", "get_weather"]),
        (req("get_time and get_weather", parallel_tool_calls=False), ["get_time"]),
        (req("use get_weather", tool_choice=ToolChoice(mode="none")), []),
        (req("nothing", tool_choice=ToolChoice(mode="required")), ["get_weather"]),
        (
            req("nothing", tool_choice=ToolChoice(mode="function", function="get_time")),
            ["get_time"],
        ),
        (req("get_weather said 9C", role="tool"), []),  # a tool result last: answer in text
        (req("get_weathering is not a mention"), []),
    ],
)
def test_the_tool_rule(request_: EngineRequest, called: list[str]) -> None:
    assert [t.name for t in planned_calls(request_)] == called


def test_scripts_finish_with_tool_calls_or_stop_for_a_named_function() -> None:
    auto = build_script(req("get_time"), seed=1)
    named = build_script(req("x", tool_choice=ToolChoice(mode="function", function="get_time")), 1)
    assert auto is not None
    assert auto.finish is FinishReason.TOOL_CALLS
    assert named is not None
    assert named.finish is FinishReason.STOP
    assert auto.call_ids[0].startswith("call_")
    assert len(auto.call_ids[0]) == 29


def test_json_formats_script_json() -> None:
    schema = Person.model_json_schema()
    script = build_script(
        req("x", tools=(), response_format=ResponseFormat(type="json_schema", schema=schema)), 3
    )
    assert script is not None
    Person.model_validate_json("".join(step.piece for step in script.steps))
    obj = build_script(req("x", tools=(), response_format=ResponseFormat(type="json_object")), 3)
    assert obj is not None
    assert isinstance(json.loads("".join(s.piece for s in obj.steps)), dict)


def test_merged_outputs_keep_one_delta_per_call() -> None:
    first = (ToolCallDelta(index=0, id="call_a", name="f", arguments='{"'),)
    later = (
        ToolCallDelta(index=0, arguments='a": 1}'),
        ToolCallDelta(index=1, id="call_b", name="g", arguments="{"),
    )
    merged = merge_tool_calls(first, later)
    assert merged == (
        ToolCallDelta(index=0, id="call_a", name="f", arguments='{"a": 1}'),
        ToolCallDelta(index=1, id="call_b", name="g", arguments="{"),
    )
