"""The Responses API at the edge without a server: a Responses request → the chat request it
means, errors named in Responses terms, and the ``response`` object and event stream checked
against the OpenAI SDK's own types."""

from __future__ import annotations

import json
import typing
from typing import Any

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from meridian.v1 import worker_pb2
from services.common.errors import InvalidRequest, Unavailable
from services.edge.dialects.base import validate_object
from services.edge.openai_responses import (
    ResponsesRequest,
    ResponsesTurn,
    chat_body,
    in_responses_terms,
    responses_param,
)
from services.edge.openai_types import validate_chat_request
from services.edge.render_response import (
    ResponseEvents,
    assistant_message,
    output_items,
    response_object,
)


def _event_types() -> dict[str, type[pydantic.BaseModel]]:
    """The SDK's event union, by each event's ``type``: validating against one class gives
    one precise error rather than one per member of the union."""
    (union, *_) = typing.get_args(ResponseStreamEvent)
    out = {}
    for cls in typing.get_args(union):
        (literal,) = typing.get_args(cls.model_fields["type"].annotation)
        out[literal] = cls
    return out


EVENT_TYPES = _event_types()


def request(**fields: Any) -> ResponsesRequest:
    return validate_object({"model": "m", **fields}, ResponsesRequest)


def test_instructions_become_the_system_message_and_a_string_input_the_user_message() -> None:
    body = chat_body(request(input="Hello", instructions="Be brief", max_output_tokens=9))
    assert body["messages"] == [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "Hello"},
    ]
    assert body["max_completion_tokens"] == 9
    validate_chat_request(body)


def test_function_calls_join_one_assistant_message_and_outputs_become_tool_messages() -> None:
    body = chat_body(
        request(
            input=[
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "q"}],
                },
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"a":1}'},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [
                        {"type": "input_text", "text": "t"},
                        {"type": "input_text", "text": "wo"},
                    ],
                },
                {"type": "reasoning", "summary": []},
                {"role": "assistant", "content": [{"type": "output_text", "text": "so"}]},
            ]
        )
    )
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"a":1}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": [{"type": "text", "text": "so"}]},
    ]
    validate_chat_request(body)


def test_flat_function_tools_text_format_and_tool_choice_become_chats() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    body = chat_body(
        request(
            input="x",
            tools=[{"type": "function", "name": "f", "parameters": schema, "strict": True}],
            tool_choice={"type": "function", "name": "f"},
            text={"format": {"type": "json_schema", "name": "out", "schema": schema}},
            include=["message.output_text.logprobs"],
            top_logprobs=3,
        )
    )
    assert body["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema},
    }
    assert (body["logprobs"], body["top_logprobs"]) == (True, 3)
    validate_chat_request(body)


@pytest.mark.parametrize(
    ("chat", "responses"),
    [
        ("max_completion_tokens", "max_output_tokens"),
        ("tools[3].function.parameters", "tools[3].parameters"),
        ("tools[0].function.name", "tools[0].name"),
        ("response_format.json_schema.schema", "text.format.schema"),
        ("response_format.json_schema.name", "text.format.name"),
        ("tool_choice.function.name", "tool_choice.name"),
        ("messages[4].content", "input"),  # items and messages are not one-to-one
        ("messages", "input"),
        ("temperature", "temperature"),
    ],
)
def test_chat_field_names_are_given_back_in_responses_terms(chat: str, responses: str) -> None:
    assert responses_param(chat) == responses
    err = in_responses_terms(InvalidRequest(f"Invalid value for '{chat}': no.", param=chat))
    assert err.param == responses
    assert f"'{responses}'" in err.message


def test_a_tool_with_a_bad_schema_is_named_as_the_responses_tool() -> None:
    body = chat_body(
        request(input="x", tools=[{"type": "function", "name": "f", "parameters": {"type": 3}}])
    )
    with pytest.raises(InvalidRequest) as raised:
        validate_chat_request(body)
    assert in_responses_terms(raised.value).param == "tools[0].parameters"


def _chunk(**fields: Any) -> worker_pb2.GenerateChunk:
    return worker_pb2.GenerateChunk(**fields)


def _events(data: bytes) -> list[dict[str, Any]]:
    """The SSE stream → its events, each checked: the ``event:`` line names its type and the
    SDK's own event union accepts it."""
    out = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        head, body = block.split("\n", 1)
        payload = json.loads(body.removeprefix("data: "))
        assert head == f"event: {payload['type']}"
        EVENT_TYPES[payload["type"]].model_validate(payload)
        out.append(payload)
    return out


def test_a_text_stream_is_openais_sequence_and_each_event_is_an_sdk_event() -> None:
    events = ResponseEvents(
        response_id="resp_ab", req=request(input="x"), created=1, logprobs=False
    )
    data = events.start()
    for text in ("Hel", "lo"):
        data += events.chunk(_chunk(text=text))
    usage = worker_pb2.Usage(prompt_tokens=3, completion_tokens=2)
    data += events.finish(events.final("stop", usage))
    got = _events(data)
    assert [e["type"] for e in got] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in got] == list(range(10))
    final = Response.model_validate(got[-1]["response"])
    assert final.output_text == "Hello"
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (3, 2)


def test_streamed_tool_calls_are_function_call_items_with_argument_deltas() -> None:
    events = ResponseEvents(
        response_id="resp_ab", req=request(input="x"), created=1, logprobs=False
    )
    data = events.start()
    data += events.chunk(
        _chunk(tool_calls=[worker_pb2.ToolCallDelta(index=0, id="call_1", name="f", arguments="{")])
    )
    data += events.chunk(
        _chunk(tool_calls=[worker_pb2.ToolCallDelta(index=0, arguments='"a": 1}')])
    )
    data += events.chunk(
        _chunk(
            tool_calls=[worker_pb2.ToolCallDelta(index=1, id="call_2", name="g", arguments="{}")]
        )
    )
    data += events.finish(events.final("tool_calls", worker_pb2.Usage()))
    got = _events(data)
    added = [e for e in got if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["call_id"]) for e in added] == [
        (0, "call_1"),
        (1, "call_2"),
    ]
    done = [e for e in got if e["type"] == "response.function_call_arguments.done"]
    assert [e["arguments"] for e in done] == ['{"a": 1}', "{}"]
    final = Response.model_validate(got[-1]["response"])
    assert [o.type for o in final.output] == ["function_call", "function_call"]
    assert final.status == "completed"


def _item_events(got: list[dict[str, Any]]) -> list[tuple[str, int]]:
    kinds = ("response.output_item.added", "response.output_item.done")
    return [(e["type"].rsplit(".", 1)[1], e["output_index"]) for e in got if e["type"] in kinds]


def test_each_item_is_closed_before_the_next_is_added() -> None:
    """As on OpenAI's: an agent loop can run a call on its ``output_item.done`` while the
    next is still being generated."""
    events = ResponseEvents(
        response_id="resp_ab", req=request(input="x"), created=1, logprobs=False
    )
    data = events.start() + events.chunk(_chunk(text="Let me look."))
    data += events.chunk(
        _chunk(
            tool_calls=[worker_pb2.ToolCallDelta(index=0, id="call_1", name="f", arguments="{}")]
        )
    )
    data += events.chunk(
        _chunk(tool_calls=[worker_pb2.ToolCallDelta(index=1, id="call_2", name="g", arguments="{")])
    )
    data += events.chunk(_chunk(tool_calls=[worker_pb2.ToolCallDelta(index=1, arguments="}")]))
    data += events.finish(events.final("length", worker_pb2.Usage()))
    got = _events(data)
    assert _item_events(got) == [
        ("added", 0),
        ("done", 0),
        ("added", 1),
        ("done", 1),
        ("added", 2),
        ("done", 2),
    ]
    done = {e["output_index"]: e["item"] for e in got if e["type"] == "response.output_item.done"}
    assert done[0]["content"][0]["text"] == "Let me look."
    assert done[1]["arguments"] == "{}"
    # the items closed early are whole; the last one ends with the response (cut short here)
    assert [item["status"] for item in done.values()] == ["completed", "completed", "incomplete"]
    final = Response.model_validate(got[-1]["response"])
    assert final.status == "incomplete"
    statuses = [getattr(o, "status", None) for o in final.output]
    assert statuses == ["completed", "completed", "incomplete"]


def test_text_after_a_function_call_is_a_new_message_item() -> None:
    events = ResponseEvents(
        response_id="resp_ab", req=request(input="x"), created=1, logprobs=False
    )
    data = events.start() + events.chunk(_chunk(text="a"))
    data += events.chunk(
        _chunk(
            tool_calls=[worker_pb2.ToolCallDelta(index=0, id="call_1", name="f", arguments="{}")]
        )
    )
    data += events.chunk(_chunk(text="b"))
    data += events.finish(events.final("stop", worker_pb2.Usage()))
    got = _events(data)
    opened_then_closed = [(kind, i) for i in range(3) for kind in ("added", "done")]
    assert _item_events(got) == opened_then_closed
    final = Response.model_validate(got[-1]["response"])
    assert [(o.type, o.id) for o in final.output] == [
        ("message", "msg_ab"),
        ("function_call", "fc_ab_0"),
        ("message", "msg_ab_1"),
    ]
    assert final.output_text == "ab"


def test_a_failure_after_the_headers_is_an_error_event_then_response_failed() -> None:
    events = ResponseEvents(
        response_id="resp_ab", req=request(input="x"), created=1, logprobs=False
    )
    data = events.start() + events.chunk(_chunk(text="par"))
    data += events.failed(Unavailable("the worker went away"), worker_pb2.Usage())
    got = _events(data)
    assert [e["type"] for e in got[-2:]] == ["error", "response.failed"]
    assert got[-1]["response"]["status"] == "failed"
    assert got[-1]["response"]["error"]["message"] == "the worker went away"


def test_a_failure_before_the_first_token_still_opens_the_response() -> None:
    events = ResponseEvents(
        response_id="resp_ab", req=request(input="x"), created=1, logprobs=False
    )
    got = _events(events.failed(Unavailable("no first token in time"), None))
    assert [(e["type"], e["sequence_number"]) for e in got] == [
        ("response.created", 0),
        ("response.in_progress", 1),
        ("error", 2),
        ("response.failed", 3),
    ]


def test_an_empty_answer_still_has_one_message() -> None:
    events = ResponseEvents(
        response_id="resp_ab", req=request(input="x"), created=1, logprobs=False
    )
    got = _events(events.start() + events.finish(events.final("stop", worker_pb2.Usage())))
    final = Response.model_validate(got[-1]["response"])
    assert [o.type for o in final.output] == ["message"]
    assert final.output_text == ""
    assert "response.output_text.delta" not in [e["type"] for e in got], "no empty delta"


def test_a_turn_goes_on_from_the_previous_conversation_without_its_instructions() -> None:
    previous = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    turn = ResponsesTurn(request(input="c", instructions="new"), previous=previous)
    body = chat_body(turn.req, turn)
    assert body["messages"] == [
        {"role": "system", "content": "new"},
        *previous,
        {"role": "user", "content": "c"},
    ]
    assert turn.input_messages == [{"role": "user", "content": "c"}]
    assert turn.input_items("resp_ab") == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "c"}],
            "id": "item_ab_0",
            "status": "completed",
        }
    ]


def test_the_stored_context_gets_the_answer_as_one_assistant_message() -> None:
    output: list[dict[str, Any]] = [
        {"type": "message", "content": [{"type": "output_text", "text": "so "}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]
    assert assistant_message(output) == {
        "role": "assistant",
        "content": "so ",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    assert assistant_message([]) == {"role": "assistant", "content": ""}


def test_a_whole_response_is_an_sdk_response_and_length_makes_it_incomplete() -> None:
    choice = {"message": {"content": "hi", "tool_calls": None}, "finish_reason": "length"}
    body = response_object(
        response_id="resp_1",
        req=request(input="x", max_output_tokens=2, metadata={"k": "v"}),
        created=1,
        status="incomplete",
        output=output_items("resp_1", choice, None),
        usage=worker_pb2.Usage(prompt_tokens=1, completion_tokens=2),
    )
    r = Response.model_validate(body)
    assert r.status == "incomplete"
    assert r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.metadata == {"k": "v"}
    assert r.output_text == "hi"


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"role": ["user"], "content": "x"}, "input[0].role"),
        ({"role": {"a": 1}, "content": "x"}, "input[0].role"),
        ({"role": "user", "content": [{"type": ["input_text"]}]}, "input[0].content[0].type"),
        ({"role": "user", "content": [{"type": {}}]}, "input[0].content[0].type"),
        ({"role": "user", "content": ["text"]}, "input[0].content[0].type"),
    ],
)
def test_odd_json_types_in_an_item_are_400s_naming_it(item: dict[str, Any], param: str) -> None:
    """A list or an object where a string belongs was an unhashable TypeError (a 500)."""
    with pytest.raises(InvalidRequest) as raised:
        chat_body(request(input=[item]))
    assert raised.value.param == param


def test_a_function_call_without_its_output_is_a_400_naming_the_call() -> None:
    """As OpenAI's: the model would be shown a call that never returned."""
    call = {"type": "function_call", "call_id": "call_9", "name": "f", "arguments": "{}"}
    answered = {"type": "function_call_output", "call_id": "call_9", "output": "ok"}
    with pytest.raises(InvalidRequest) as raised:
        chat_body(request(input=[{"role": "user", "content": "q"}, call]))
    assert raised.value.param == "input"
    assert str(raised.value) == "No tool output found for function call call_9."
    chat_body(request(input=[{"role": "user", "content": "q"}, call, answered]))  # answered


def test_a_stored_turns_function_call_needs_its_output_in_the_next_input() -> None:
    previous: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
    ]
    plain = ResponsesTurn(request(input="and now?"), previous=previous)
    with pytest.raises(InvalidRequest, match="function call call_1"):
        chat_body(plain.req, plain)
    output = {"type": "function_call_output", "call_id": "call_1", "output": "42"}
    answered = ResponsesTurn(request(input=[output]), previous=previous)
    body = chat_body(answered.req, answered)
    assert body["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "42"}
