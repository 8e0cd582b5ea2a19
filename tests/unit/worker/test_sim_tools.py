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


class Address(BaseModel):
    street: str
    zip: str | None = None


class Person(BaseModel):
    name: str
    age: int
    tags: list[str]
    home: Address
    friends: list[Address] = []


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
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[str(i) for i in range(len(SCHEMAS))])
@pytest.mark.parametrize("seed", [0, 1, 2, 99])
def test_generated_instances_validate_against_their_schema(
    schema: dict[str, Any], seed: int
) -> None:
    value = jsongen.generate(schema, seed)
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    json.dumps(value)  # and it is JSON


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
