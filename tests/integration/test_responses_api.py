"""POST /v1/responses (OpenAI's Responses API) on the whole path — edge → router → SimEngine
workers over real sockets — through the official OpenAI SDK: plain text, the typed event
stream and the SDK's stream helper, function tools and their outputs, structured outputs
with ``responses.parse``, logprobs, stored responses (``previous_response_id``, retrieve,
input items, delete, tenants kept apart) and every refusal naming its field."""

from __future__ import annotations

import json
import threading
from typing import Any

import aiohttp
import openai
import pydantic
import pytest

from services.edge.tenancy.tenants import Limits
from tests.integration.conftest import MODEL, Stack

WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
    "strict": True,
}


def client(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.key, max_retries=0)


async def create(c: openai.AsyncOpenAI, **request: Any) -> Any:
    """``responses.create`` untyped: the SDK's unions of every hosted tool's item and event
    type are not what these tests are about."""
    return await c.responses.create(**request)


async def post(stack: Stack, body: dict[str, Any]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.base_url}/responses",
            headers={"Authorization": f"Bearer {stack.key}"},
            json=body,
        ) as resp,
    ):
        return resp.status, json.loads(await resp.read())


async def test_a_response_has_its_text_usage_and_the_openai_shape(stack: Stack) -> None:
    async with client(stack) as c:
        raw = await c.responses.with_raw_response.create(
            model=MODEL, input="Say something", instructions="Be brief.", max_output_tokens=6
        )
    r: Any = raw.parse()
    assert r.id.startswith("resp_")
    assert r.object == "response"
    assert r.model == MODEL
    assert r.instructions == "Be brief."
    assert r.to_dict()["store"] is True
    [message] = r.output
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.content[0].type == "output_text"
    assert r.output_text
    assert r.output_text == message.content[0].text
    assert r.usage is not None
    assert r.usage.output_tokens == 6
    assert r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert raw.headers["x-request-id"] == r.id
    assert raw.headers["x-meridian-region"]


async def test_running_out_of_max_output_tokens_is_an_incomplete_response(stack: Stack) -> None:
    async with client(stack) as c:
        r = await create(c, model=MODEL, input="Go on", max_output_tokens=3)
    assert r.status == "incomplete"
    assert r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"
    assert r.usage is not None
    assert r.usage.output_tokens == 3


async def test_instructions_and_input_are_the_chat_requests_system_and_user_messages(
    stack: Stack,
) -> None:
    """The same seed gives the same text on both APIs: the translation is the chat request
    a client would have sent (routing, admission and the engine see no difference)."""
    async with client(stack) as c:
        r = await create(
            c,
            model=MODEL,
            instructions="You are terse.",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Hello"}]}],
            max_output_tokens=8,
            temperature=1.0,
            extra_body={"seed": 5},
        )
        chat = await c.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Hello"},
            ],
            max_completion_tokens=8,
            temperature=1.0,
            seed=5,
        )
    assert r.output_text == chat.choices[0].message.content
    assert r.usage is not None
    assert chat.usage is not None
    assert r.usage.input_tokens == chat.usage.prompt_tokens


async def test_a_streamed_response_is_openais_event_sequence(stack: Stack) -> None:
    async with client(stack) as c:
        stream = await create(c, model=MODEL, input="Stream this", max_output_tokens=5, stream=True)
        events = [e async for e in stream]
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 1
    assert types[4 : 4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert types[4 + len(deltas) :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # max_output_tokens ran out
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(d.delta for d in deltas)
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert text
    assert done.text == text == final.output_text
    assert final.usage is not None
    assert final.usage.output_tokens == 5
    assert {e.response.id for e in events if hasattr(e, "response")} == {final.id}


async def test_the_sdks_stream_helper_assembles_the_final_response(stack: Stack) -> None:
    async with (
        client(stack) as c,
        c.responses.stream(model=MODEL, input="Tell me", max_output_tokens=2000) as stream,
    ):
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == "".join(deltas)


async def test_a_function_call_and_its_output_continue_the_conversation(stack: Stack) -> None:
    async with client(stack) as c:
        first = await create(
            c,
            model=MODEL,
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
        )
        calls = [o for o in first.output if o.type == "function_call"]
        assert calls, first.output
        call = calls[0]
        assert call.name == "get_weather"
        assert call.call_id
        args = json.loads(call.arguments)
        assert isinstance(args["city"], str)
        assert isinstance(args["days"], int)
        second = await create(
            c,
            model=MODEL,
            input=[
                {"role": "user", "content": "What is the weather in Paris?"},
                *[o.model_dump(exclude_none=True) for o in first.output],
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
            ],
            tools=[WEATHER],
            tool_choice="none",
            max_output_tokens=6,
        )
    assert second.output_text
    assert [o.type for o in second.output] == ["message"]


async def test_streamed_function_calls_assemble_in_the_stream_helper(stack: Stack) -> None:
    async with (
        client(stack) as c,
        c.responses.stream(  # type: ignore[call-overload]
            model=MODEL,
            input="Weather?",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
        ) as stream,
    ):
        arg_deltas = [
            e.delta async for e in stream if e.type == "response.function_call_arguments.delta"
        ]
        final = await stream.get_final_response()
    [call] = [o for o in final.output if o.type == "function_call"]
    assert call.arguments == "".join(arg_deltas)
    assert set(json.loads(call.arguments)) == {"city", "days"}


class Forecast(pydantic.BaseModel):
    city: str
    days: int
    sunny: bool


async def test_responses_parse_returns_a_validated_object(stack: Stack) -> None:
    async with client(stack) as c:
        parsed = await c.responses.parse(
            model=MODEL, input="A forecast as JSON", text_format=Forecast
        )
    assert isinstance(parsed.output_parsed, Forecast)


async def test_logprobs_are_included_when_asked_for(stack: Stack) -> None:
    async with client(stack) as c:
        r = await create(
            c,
            model=MODEL,
            input="x",
            include=["message.output_text.logprobs"],
            top_logprobs=2,
            max_output_tokens=4,
        )
        plain = await create(c, model=MODEL, input="x", max_output_tokens=4)
    part = r.output[0].content[0]
    assert part.logprobs is not None
    assert len(part.logprobs) == 4
    assert "".join(lp.token for lp in part.logprobs) == part.text
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    assert plain.output[0].content[0].logprobs == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": ""}, "input"),
        ({"input": 7}, "input"),
        ({"input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"type": "web_search_call"}]}, "input[0].type"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "previous_response_id": "resp_" + "0" * 32}, "previous_response_id"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
        (
            {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": 1}}]},
            "tools[0].parameters",
        ),
        ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        (
            {
                "input": "x",
                "text": {
                    "format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}
                },
            },
            "text.format.schema",
        ),
        ({"input": "x", "include": ["everything"]}, "include"),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}},
            "text.format.name",
        ),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}},
            "text.format.schema",
        ),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),  # no tools to require
    ],
)
async def test_bad_responses_requests_are_400s_naming_the_responses_field(
    stack: Stack, body: dict[str, Any], param: str
) -> None:
    status, answer = await post(stack, {"model": MODEL, **body})
    assert status == 400, answer
    assert answer["error"]["param"] == param, answer


async def test_a_refusal_past_validation_names_the_responses_field(stack: Stack) -> None:
    """The worker checks the context (8,192 tokens in the sim) on the chat request this one
    became, and says max_tokens; the client sent max_output_tokens."""
    status, answer = await post(stack, {"model": MODEL, "input": "x", "max_output_tokens": 9000})
    assert status == 400, answer
    assert answer["error"]["code"] == "context_length_exceeded"
    assert answer["error"]["param"] == "max_output_tokens", answer


async def test_truncation_auto_drops_the_oldest_turns_to_fit_the_context(stack: Stack) -> None:
    """A conversation past the context (8,192 tokens in the sim) is refused by default; with
    truncation "auto" its oldest turns are dropped — the instructions stay — and it is
    answered, its usage the kept prompt's. Chat takes the same field (Meridian's extension)."""
    turns = [
        {"role": "user", "content": " ".join(["history"] * 9000)},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "What now?"},
    ]
    body = {"model": MODEL, "input": turns, "instructions": "Be brief.", "max_output_tokens": 4}
    status, refused = await post(stack, body)
    assert status == 400, refused
    assert refused["error"]["code"] == "context_length_exceeded"
    status, answer = await post(stack, {**body, "truncation": "auto"})
    assert status == 200, answer
    assert answer["truncation"] == "auto"
    assert answer["usage"]["output_tokens"] == 4
    assert 0 < answer["usage"]["input_tokens"] < 64  # "Be brief." and "What now?"
    async with client(stack) as c:
        chat = await c.chat.completions.create(
            model=MODEL,
            messages=turns,  # type: ignore[arg-type]
            max_tokens=4,
            extra_body={"truncation": "auto"},
        )
    assert chat.usage is not None
    assert 0 < chat.usage.prompt_tokens < 64


async def test_a_long_stored_conversation_is_read_and_checked_off_the_loop(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn that goes on from a conversation of 100 KB parses and checks it in the
    offload thread, as a body that size is (stages/validate.py): the loop serves everyone."""
    from services.edge.dialects.responses import ResponsesDialect

    threads: list[str] = []
    translate = ResponsesDialect._translate

    def spy(self: ResponsesDialect, *args: Any) -> None:
        threads.append(threading.current_thread().name)
        translate(self, *args)

    monkeypatch.setattr(ResponsesDialect, "_translate", spy)
    long_input = "Hello" + " " * 100_000 + "there"  # whitespace runs: few tokens in the sim
    async with client(stack) as c:
        first = await create(c, model=MODEL, input=long_input, max_output_tokens=2)
        small = await create(c, model=MODEL, input="short", max_output_tokens=2)
        second = await create(
            c, model=MODEL, previous_response_id=first.id, input="And?", max_output_tokens=2
        )
        items = await c.responses.input_items.list(second.id)
    assert second.status == "incomplete"
    assert small.output_text
    assert [i.content[0].text for i in items.data] == ["And?"]  # type: ignore[index,union-attr]
    # the long body, a short one, then the short body going on from the long conversation
    assert [t.startswith("edge-offload") for t in threads] == [True, False, True]


async def test_previous_response_id_goes_on_from_the_stored_conversation(stack: Stack) -> None:
    """The stored turn (its input and its answer, not its instructions, as on OpenAI's) comes
    before the new input: the same seed gives the same text as sending the whole
    conversation again."""
    async with client(stack) as c:
        first = await create(c, model=MODEL, input="Hello", instructions="Be terse.")
        assert first.to_dict()["store"] is True
        ask = {"model": MODEL, "max_output_tokens": 8, "extra_body": {"seed": 9}}
        chained = await create(c, previous_response_id=first.id, input="And then?", **ask)
        whole = await create(
            c,
            input=[
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "And then?"},
            ],
            **ask,
        )
    assert chained.previous_response_id == first.id
    assert chained.output_text == whole.output_text
    assert chained.usage.input_tokens == whole.usage.input_tokens


async def test_a_function_call_is_answered_by_its_output_after_previous_response_id(
    stack: Stack,
) -> None:
    async with client(stack) as c:
        first = await create(
            c, model=MODEL, input="Weather?", tools=[WEATHER], tool_choice="required"
        )
        calls = [o for o in first.output if o.type == "function_call"]
        assert calls
        with pytest.raises(openai.BadRequestError) as unanswered:
            await create(c, model=MODEL, previous_response_id=first.id, input="And?")
        assert unanswered.value.param == "input"
        assert f"No tool output found for function call {calls[0].call_id}" in str(unanswered.value)
        second = await create(
            c,
            model=MODEL,
            previous_response_id=first.id,
            input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": "rain"}
                for call in calls
            ],
            tools=[WEATHER],
            tool_choice="none",
            max_output_tokens=5,
        )
    assert second.status == "incomplete"
    assert second.output_text


async def test_a_stored_response_is_retrieved_listed_and_deleted(stack: Stack) -> None:
    async with client(stack) as c:
        stream = await create(c, model=MODEL, input="Stored?", max_output_tokens=4, stream=True)
        events = [e async for e in stream]
        final = events[-1].response
        got = await c.responses.retrieve(final.id)
        items: Any = await c.responses.input_items.list(final.id)
        await c.responses.delete(final.id)  # raises unless it was there
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve(final.id)
        with pytest.raises(openai.BadRequestError) as gone:
            await create(c, model=MODEL, previous_response_id=final.id, input="more")
    assert final.to_dict()["store"] is True
    assert got.id == final.id
    assert got.output_text == final.output_text
    assert got.status == "incomplete"
    assert [i.type for i in items.data] == ["message"]
    assert items.data[0].content[0].text == "Stored?"
    assert gone.value.code == "previous_response_not_found"


async def test_input_items_page_through_the_sdks_cursor_in_either_order(stack: Stack) -> None:
    turns = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four"},
        {"role": "user", "content": "five"},
    ]
    async with client(stack) as c:
        r = await create(c, model=MODEL, input=turns, max_output_tokens=2)
        newest_first = [i async for i in c.responses.input_items.list(r.id, limit=2)]
        oldest_first = [i async for i in c.responses.input_items.list(r.id, order="asc")]
        first_page = await c.responses.input_items.list(r.id, limit=2, order="asc")
    texts = [item.content[0].text for item in oldest_first]  # type: ignore[index,union-attr]
    assert texts == ["one", "two", "three", "four", "five"]
    assert [i.id for i in newest_first] == [i.id for i in oldest_first][::-1]
    assert [i.status for i in oldest_first] == ["completed"] * 5  # type: ignore[union-attr]
    assert first_page.has_more
    assert [i.id for i in first_page.data] == [i.id for i in oldest_first[:2]]
    last = oldest_first[-1].id
    for query, param in [
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"order": "sideways"}, "order"),
        ({"after": "item_unknown"}, "after"),
    ]:
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"{stack.edge.url}/v1/responses/{r.id}/input_items",
                params=query,
                headers={"Authorization": f"Bearer {stack.key}"},
            ) as resp,
        ):
            answer = await resp.json()
        assert (resp.status, answer["error"]["param"]) == (400, param), (query, answer)
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{stack.edge.url}/v1/responses/{r.id}/input_items",
            params={"after": last, "order": "asc"},
            headers={"Authorization": f"Bearer {stack.key}"},
        ) as resp,
    ):
        assert (resp.status, await resp.json()) == (
            200,
            {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False},
        )


async def test_a_whole_response_is_stored_saying_it_is_stored(stack: Stack) -> None:
    async with client(stack) as c:
        r = await create(c, model=MODEL, input="Keep me", max_output_tokens=3)
        got = await c.responses.retrieve(r.id)
    assert r.to_dict()["store"] is True
    assert got.to_dict()["store"] is True, "the stored copy says what the answer said"
    assert got.output_text == r.output_text


async def test_tool_choice_auto_or_none_without_tools_is_served(stack: Stack) -> None:
    """Every response echoes ``tool_choice: "auto"``; a client replaying it is not refused."""
    async with client(stack) as c:
        for choice in ("auto", "none"):
            r = await create(c, model=MODEL, input="x", tool_choice=choice, max_output_tokens=2)
            assert r.output_text


async def test_store_false_keeps_nothing(stack: Stack) -> None:
    async with client(stack) as c:
        r = await create(c, model=MODEL, input="Private", store=False, max_output_tokens=3)
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve(r.id)
    assert r.to_dict()["store"] is False


async def test_another_tenants_response_is_not_found(stack: Stack) -> None:
    async with client(stack) as c:
        mine = await create(c, model=MODEL, input="Mine", max_output_tokens=3)
    other_key = await stack.edge.new_key("t2")
    async with openai.AsyncOpenAI(
        base_url=stack.base_url, api_key=other_key, max_retries=0
    ) as other:
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(mine.id)
        with pytest.raises(openai.BadRequestError) as refused:
            await create(other, model=MODEL, previous_response_id=mine.id, input="x")
    assert refused.value.code == "previous_response_not_found"


async def test_stored_response_routes_check_the_key_first(stack: Stack) -> None:
    async with client(stack) as c:
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve("resp_123")
        with pytest.raises(openai.NotFoundError):
            await c.responses.delete("resp_" + "a" * 32)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{stack.base_url}/responses/resp_123") as resp,
    ):
        assert resp.status == 401, "the key is checked first, as on every API route"


async def test_reading_stored_responses_counts_against_the_keys_request_limit(
    stack: Stack,
) -> None:
    """A key cannot read stored conversations faster than its rpm: each GET (or DELETE) of a
    stored response is one request, refused past the limit with the usual 429 and headers."""
    key = await stack.edge.new_key("reader", limits=Limits(rpm=3))
    async with openai.AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=0) as c:
        stored = await create(c, model=MODEL, input="Keep me", max_output_tokens=2)
        async with aiohttp.ClientSession() as http:
            auth = {"Authorization": f"Bearer {key}"}
            url = f"{stack.base_url}/responses/{stored.id}"
            async with http.get(url, headers=auth) as first:
                assert first.status == 200
                assert first.headers["x-ratelimit-remaining-requests"] == "1"
            async with http.get(f"{url}/input_items", headers=auth) as second:
                assert second.status == 200
                assert second.headers["x-ratelimit-remaining-requests"] == "0"
            async with http.get(url, headers=auth) as third:
                body = json.loads(await third.read())
                assert third.status == 429, body
                assert body["error"]["type"] == "rate_limit_error", body
                assert int(third.headers["retry-after"]) > 0
                assert third.headers["x-ratelimit-limit-requests"] == "3"
        with pytest.raises(openai.RateLimitError):
            await c.responses.delete(stored.id)
    async with client(stack) as unlimited:  # another tenant: its 404, not this one's 429
        with pytest.raises(openai.NotFoundError):
            await unlimited.responses.retrieve(stored.id)
