"""The edge's side of tools, structured outputs and n: what a request needs of a worker, the
Generate proto it builds, and the response shapes (tool-call deltas, several choices)."""

from __future__ import annotations

import json
from typing import Any

from meridian.v1 import worker_pb2
from services.common.jsonstruct import from_struct, to_struct
from services.edge.dialects.chat import chat_needs
from services.edge.openai_types import parse_chat_request
from services.edge.render import ChoiceAssembler, ChunkRenderer, tool_deltas

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "integer", "maximum": 3}},
            },
        },
    }
]


def parse(**body: Any) -> Any:
    raw = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    return parse_chat_request(json.dumps(raw).encode())


def test_needs_follow_what_the_request_asks() -> None:
    assert chat_needs(parse()).tools is False
    auto = chat_needs(parse(tools=TOOLS))
    assert (auto.tools, auto.structured_outputs) == (True, False)
    forced = chat_needs(parse(tools=TOOLS, tool_choice="required"))
    assert (forced.tools, forced.structured_outputs) == (True, True)
    assert chat_needs(parse(tools=TOOLS, tool_choice="none")).tools is False
    assert chat_needs(parse(response_format={"type": "json_object"})).structured_outputs
    assert chat_needs(parse(n=4)).n == 4


def test_only_plain_single_choice_text_streams_are_portable() -> None:
    assert parse().stream_state_portable
    assert not parse(tools=TOOLS).stream_state_portable
    assert not parse(n=2).stream_state_portable
    assert not parse(response_format={"type": "json_object"}).stream_state_portable


def test_schemas_survive_the_struct_round_trip_with_their_integers() -> None:
    schema = TOOLS[0]["function"]["parameters"]
    back = from_struct(to_struct(schema))
    assert back == schema
    assert isinstance(back["properties"]["n"]["maximum"], int)


def test_tool_deltas_have_openais_incremental_shape() -> None:
    first = worker_pb2.ToolCallDelta(index=0, id="call_1", type="function", name="f")
    more = worker_pb2.ToolCallDelta(index=0, arguments='{"n"')
    assert tool_deltas([first, more]) == [
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "f", "arguments": ""},
        },
        {"index": 0, "function": {"arguments": '{"n"'}},
    ]


def test_streamed_chunks_carry_their_choice_index() -> None:
    render = ChunkRenderer(completion_id="c", model="m", created=1, fingerprint="f", usage=False)
    data = render.content(worker_pb2.GenerateChunk(text="hi", index=2))
    assert data is not None
    body = json.loads(data[6:])
    assert body["choices"][0]["index"] == 2
    assert body["choices"][0]["delta"] == {"content": "hi"}
    assert json.loads(render.finish("tool_calls", 1)[6:])["choices"][0]["index"] == 1


def test_choices_assemble_text_and_calls_per_index() -> None:
    choices = ChoiceAssembler(choices=2, logprobs=False)
    choices.add(
        worker_pb2.GenerateChunk(
            index=1, tool_calls=[worker_pb2.ToolCallDelta(index=0, id="call_1", name="f")]
        )
    )
    choices.add(worker_pb2.GenerateChunk(index=0, text="a"))
    choices.add(
        worker_pb2.GenerateChunk(
            index=1,
            tool_calls=[worker_pb2.ToolCallDelta(index=0, arguments="{}")],
            finish_reason=worker_pb2.FINISH_REASON_TOOL_CALLS,
        )
    )
    choices.add(worker_pb2.GenerateChunk(index=0, finish_reason=worker_pb2.FINISH_REASON_STOP))
    out = choices.choices()
    assert out[0]["message"]["content"] == "a"
    assert out[0]["finish_reason"] == "stop"
    assert out[1]["message"]["content"] is None
    assert out[1]["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]
    assert out[1]["finish_reason"] == "tool_calls"
    assert choices.tool_calls() == 1


def test_a_schema_naming_an_unknown_draft_is_refused_not_fetched() -> None:
    import pytest

    from services.common.errors import InvalidRequest

    bad = {"$schema": "http://127.0.0.1:9/evil", "type": "object"}
    with pytest.raises(InvalidRequest) as err:
        parse(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}})
    assert err.value.param == "response_format.json_schema.schema"
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}
    parse(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": draft7}})
