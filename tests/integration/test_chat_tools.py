"""Tools, structured outputs and ``n`` on the whole path with the official OpenAI SDK: edge →
router → simulated workers over real sockets, SDK-side assembly of streamed tool calls,
``chat.completions.parse`` with a pydantic model, several choices, and the 400s that name
the field. SimEngine's tool rule is in services/worker/sim/script.py."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from services.edge.openai_types import parse_chat_request
from services.edge.prompt import estimate_prompt_tokens
from services.edge.tenancy.tenants import Limits
from tests.integration.conftest import MODEL, Stack
from tests.support.recursive_models import Chain, Tree
from tests.support.wait import eventually

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
]


def client(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.key, max_retries=0)


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


async def test_auto_tool_choice_returns_calls_that_validate(stack: Stack) -> None:
    async with client(stack) as api:
        done = await api.chat.completions.create(
            model=MODEL, messages=user("What is the weather? Use get_weather."), tools=TOOLS
        )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert done.usage is not None
    assert done.usage.completion_tokens > 0


async def test_streamed_tool_calls_are_assembled_by_the_sdk(stack: Stack) -> None:
    async with (
        client(stack) as api,
        api.chat.completions.stream(
            model=MODEL,
            messages=user("call get_time and get_weather"),
            tools=TOOLS,
        ) as stream,
    ):
        events = [event async for event in stream]
        final = await stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls is not None
    assert [c.function.name for c in calls] == ["get_time", "get_weather"]
    assert len({c.id for c in calls}) == 2
    jsonschema.validate(json.loads(calls[1].function.arguments), WEATHER)
    assert final.choices[0].finish_reason == "tool_calls"
    kinds = {e.type for e in events}
    assert "tool_calls.function.arguments.delta" in kinds
    assert "tool_calls.function.arguments.done" in kinds


async def test_streamed_deltas_have_openais_incremental_shape(stack: Stack) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {stack.key}"},
            json={
                "model": MODEL,
                "messages": user("hi"),
                "tools": TOOLS,
                "tool_choice": "required",
                "parallel_tool_calls": False,
                "stream": True,
            },
        ) as resp,
    ):
        raw = (await resp.read()).decode()
    frames = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    deltas = [
        tc
        for f in frames[:-1]
        for c in json.loads(f)["choices"]
        for tc in c["delta"].get("tool_calls", [])
    ]
    head, *rest = deltas
    assert head["index"] == 0
    assert head["type"] == "function"
    assert head["id"].startswith("call_")
    assert head["function"]["name"] == "get_weather"  # required, nothing mentioned: the first
    assert rest
    assert all(set(d) == {"index", "function"} for d in rest)
    assert all(set(d["function"]) == {"arguments"} for d in rest)
    args = head["function"]["arguments"] + "".join(d["function"]["arguments"] for d in rest)
    jsonschema.validate(json.loads(args), WEATHER)
    finishes = [c["finish_reason"] for f in frames[:-1] for c in json.loads(f)["choices"]]
    assert finishes[-1] == "tool_calls"


async def test_named_tool_choice_calls_that_function(stack: Stack) -> None:
    async with client(stack) as api:
        done = await api.chat.completions.create(
            model=MODEL,
            messages=user("anything, get_weather is not the point"),
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
    calls = done.choices[0].message.tool_calls
    assert calls is not None
    assert [c.function.name for c in calls] == ["get_time"]  # type: ignore[union-attr]
    assert done.choices[0].finish_reason == "stop"  # as OpenAI, for a named function


async def test_tool_choice_none_and_tool_results_answer_in_text(stack: Stack) -> None:
    async with client(stack) as api:
        plain = await api.chat.completions.create(
            model=MODEL, messages=user("use get_weather"), tools=TOOLS, tool_choice="none"
        )
        history: list[Any] = [
            *user("use get_weather for Seoul"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "9C"}]},
        ]
        answer = await api.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].message.content
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")


class Person(BaseModel):
    name: str
    age: int
    tags: list[str]


async def test_parse_with_a_pydantic_model_returns_a_validated_object(stack: Stack) -> None:
    async with client(stack) as api:
        done = await api.chat.completions.parse(
            model=MODEL, messages=user("Extract the person"), response_format=Person
        )
    parsed = done.choices[0].message.parsed
    assert isinstance(parsed, Person)
    assert done.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("model", [Tree, Chain])
async def test_parse_with_a_recursive_model_returns_a_validated_object(
    stack: Stack, model: type[BaseModel]
) -> None:
    async with client(stack) as api:
        for seed in range(3):
            done = await api.chat.completions.parse(
                model=MODEL,
                messages=user(f"Extract it ({seed})"),
                response_format=model,
                seed=seed,
                max_tokens=4096,
            )
            assert isinstance(done.choices[0].message.parsed, model)
            assert done.choices[0].finish_reason == "stop"


async def test_json_object_answers_a_json_object(stack: Stack) -> None:
    async with client(stack) as api:
        done = await api.chat.completions.create(
            model=MODEL, messages=user("json please"), response_format={"type": "json_object"}
        )
    assert isinstance(json.loads(done.choices[0].message.content or ""), dict)


async def test_n_choices_have_their_index_and_summed_usage(stack: Stack) -> None:
    async with client(stack) as api:
        done = await api.chat.completions.create(
            model=MODEL, messages=user("three ways"), n=3, max_tokens=4
        )
        stream = await api.chat.completions.create(
            model=MODEL,
            messages=user("three ways"),
            n=3,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in done.choices)
    assert done.usage is not None
    assert done.usage.completion_tokens == 12
    texts = {c.message.content for c in done.choices}
    assert len(texts) == 3  # each choice its own sample
    per_index: dict[int, list[str]] = {0: [], 1: [], 2: []}
    finishes: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk.choices:
            per_index[c.index].append(c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert all("".join(parts) for parts in per_index.values())
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12


async def test_n_with_tools_gives_every_choice_its_calls(stack: Stack) -> None:
    async with client(stack) as api:
        done = await api.chat.completions.create(
            model=MODEL, messages=user("get_time"), tools=TOOLS, n=2
        )
    assert [c.message.tool_calls[0].function.name for c in done.choices] == [  # type: ignore[index,union-attr]
        "get_time",
        "get_time",
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        (
            {
                "messages": [
                    *user("a"),
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                    {"role": "tool", "tool_call_id": "c2", "content": "??"},
                ]
            },
            "messages[3].tool_call_id",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object", "required": 3}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"n": 17}, "n"),
        ({"logit_bias": {"5": 101}}, "logit_bias.5"),
        ({"extra_body": {"min_p": 1.5}}, "min_p"),
        ({"extra_body": {"top_k": -2}}, "top_k"),
    ],
)
async def test_bad_feature_input_is_a_400_naming_the_field(
    stack: Stack, body: dict[str, Any], param: str
) -> None:
    async with client(stack) as api:
        with pytest.raises(openai.BadRequestError) as err:
            await api.chat.completions.create(**{"model": MODEL, "messages": user("x"), **body})
    assert err.value.status_code == 400
    assert err.value.param == param


async def test_sampling_extensions_are_accepted(stack: Stack) -> None:
    async with client(stack) as api:
        done = await api.chat.completions.create(
            model=MODEL,
            messages=user("x"),
            max_tokens=12,
            extra_body={
                "top_k": 5,
                "min_p": 0.1,
                "repetition_penalty": 1.1,
                "min_tokens": 12,
                "logit_bias": {"5": -100},
                "stop_token_ids": [1],
            },
        )
    assert done.usage is not None
    assert done.usage.completion_tokens == 12


# -- rate limits count every choice -------------------------------------------------------------


async def post(http: aiohttp.ClientSession, stack: Stack, key: str, **body: Any) -> Any:
    async with http.post(
        f"{stack.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": MODEL, "messages": user("Tell me about Seoul"), **body},
    ) as resp:
        return resp.status, dict(resp.headers), await resp.json()


def estimate(**body: Any) -> int:
    raw = json.dumps({"model": MODEL, "messages": user("Tell me about Seoul"), **body}).encode()
    return estimate_prompt_tokens(parse_chat_request(raw))


async def test_reservation_counts_max_tokens_for_every_choice(stack: Stack) -> None:
    est = estimate()
    tpm = est + 3 * 20 - 1  # one choice fits, three do not
    key = await stack.edge.new_key("n-reserve", limits=Limits(tpm=tpm))
    async with aiohttp.ClientSession() as http:
        refused = await post(http, stack, key, n=3, max_tokens=20)
        allowed = await post(http, stack, key, n=1, max_tokens=20)
    assert refused[0] == 429
    assert allowed[0] == 200


@pytest.mark.parametrize(
    "extra",
    [{"n": 3, "max_tokens": 5}, {"tools": TOOLS, "tool_choice": "required"}],
    ids=["n", "tools"],
)
async def test_settlement_charges_the_usage_of_every_choice(
    stack: Stack, extra: dict[str, Any]
) -> None:
    tpm = 100_000
    key = await stack.edge.new_key(f"settle-{len(extra)}", limits=Limits(tpm=tpm))
    limiter = stack.edge.server.limiter
    async with aiohttp.ClientSession() as http:
        status, _, first = await post(http, stack, key, **extra)
        assert status == 200
        used = first["usage"]["total_tokens"]
        if "n" in extra:
            assert first["usage"]["completion_tokens"] == 15
        # The settle is sent in the background as the response ends: wait until it is out.
        await eventually(lambda: limiter.live_leases == 0 and limiter._flusher is None)
        status, headers, _ = await post(http, stack, key, max_tokens=1)
    assert status == 200
    # What the key is charged now: the first request's real usage (all choices, or the tool
    # calls), and the probe's own reservation, not the first one's reservation.
    assert tpm - int(headers["x-ratelimit-remaining-tokens"]) == used + estimate() + 1


async def test_feature_requests_and_tool_calls_are_counted(stack: Stack) -> None:
    counters = stack.edge.counters
    before = counters.snapshot()
    async with client(stack) as api:
        await api.chat.completions.create(model=MODEL, messages=user("get_time"), tools=TOOLS)
        await api.chat.completions.create(
            model=MODEL, messages=user("x"), response_format={"type": "json_object"}, n=2
        )
    after = counters.snapshot()
    assert after["tool_requests"] - before["tool_requests"] == 1
    assert after["tool_calls_returned"] - before["tool_calls_returned"] == 1
    assert after["structured_output_requests"] - before["structured_output_requests"] == 1
    assert after["multi_choice_requests"] - before["multi_choice_requests"] == 1
