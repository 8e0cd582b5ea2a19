"""Property-based tests against a live edge: whatever arrives — any JSON, any bytes, any
header value, chat requests with every field fuzzed — the answer is a precise OpenAI-style
error or a well-formed completion; never a 5xx, a hang or a stack trace."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import MODEL
from tests.property.conftest import LiveEdge, Reply, exchange, http_request

FUZZ = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
CLIENT_ERRORS = {400, 401, 403, 404, 405, 408, 413, 429, 431}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=20), children, max_size=5)
    ),
    max_leaves=30,
)


def assert_sane(reply: Reply) -> None:
    assert reply.status == 200 or reply.status in CLIENT_ERRORS, reply
    assert b"Traceback" not in reply.body
    if reply.status != 200:
        assert reply.headers["content-type"].startswith("application/json")
        error = json.loads(reply.body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert isinstance(error["message"], str)
        assert error["message"]


def assert_completion(reply: Reply, stream: bool) -> None:
    if stream:
        frames = [f for f in reply.body.decode().split("\n\n") if f.startswith("data: ")]
        assert frames[-1] == "data: [DONE]"
        for frame in frames[:-1]:
            payload = json.loads(frame[6:])
            assert payload["object"] == "chat.completion.chunk" or "error" in payload
    else:
        payload = json.loads(reply.body)
        assert payload["object"] == "chat.completion"
        assert payload["usage"]["total_tokens"] >= payload["usage"]["completion_tokens"]


def chat(edge: LiveEdge, body: bytes, key: str | None = None) -> Reply:
    return exchange(
        edge.port,
        http_request(
            "POST",
            "/v1/chat/completions",
            body,
            headers={
                "Authorization": f"Bearer {key or edge.key}",
                "Content-Type": "application/json",
            },
        ),
    )


@FUZZ
@given(value=json_values)
def test_any_json_body_gets_a_precise_answer(live_edge: LiveEdge, value: Any) -> None:
    reply = chat(live_edge, json.dumps(value).encode())
    assert_sane(reply)
    assert reply.status == 400


@FUZZ
@given(raw=st.binary(max_size=4000))
def test_any_bytes_get_a_precise_answer(live_edge: LiveEdge, raw: bytes) -> None:
    assert_sane(chat(live_edge, raw))


valid_messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
            "content": st.text(max_size=100)
            | st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=30)}),
                min_size=1,
                max_size=3,
            ),
        }
    ),
    min_size=1,
    max_size=3,
)
junk = json_values | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5)

#: Plausible values per field; a request draws some of them, then junk for a few fields.
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "stream": st.booleans(),
    "max_tokens": st.integers(1, 30),
    "max_completion_tokens": st.integers(1, 30),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "n": st.integers(1, 3),
    "tools": st.just(
        [
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": {"type": "object"}},
            }
        ]
    ),
    "tool_choice": st.sampled_from(
        ["auto", "none", "required", {"type": "function", "function": {"name": "get_weather"}}]
    ),
    "response_format": st.sampled_from(
        [
            {"type": "text"},
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        ]
    ),
    "top_k": st.integers(-1, 50),
    "min_p": st.floats(0, 1),
    "logit_bias": st.dictionaries(st.integers(0, 1000).map(str), st.floats(-100, 100), max_size=3),
    "stop": st.text(min_size=1, max_size=5) | st.lists(st.text(min_size=1, max_size=5), max_size=4),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 20),
    "user": st.text(max_size=20),
    "ignore_eos": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
}


@st.composite
def chat_requests(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly valid requests, some fields (or the model and messages) replaced by junk."""
    body: dict[str, Any] = {"model": MODEL, "messages": draw(valid_messages), "max_tokens": 8}
    for name in draw(st.sets(st.sampled_from(sorted(FIELDS)), max_size=5)):
        body[name] = draw(FIELDS[name])
    names = [*sorted(FIELDS), "model", "messages", "surprise", "tools", "response_format"]
    for name in draw(st.sets(st.sampled_from(names), max_size=2)):
        body[name] = draw(junk)
    if body.get("ignore_eos") is True and isinstance(body.get("max_tokens"), int):
        body["max_tokens"] = min(body["max_tokens"], 30)
    return body


@FUZZ
@given(body=chat_requests())
def test_fuzzed_chat_requests_get_errors_or_well_formed_completions(
    live_edge: LiveEdge, body: dict[str, Any]
) -> None:
    try:
        raw = json.dumps(body, allow_nan=True).encode()
    except ValueError:
        assume(False)
    reply = chat(live_edge, raw)
    event(f"status {reply.status}")
    assert_sane(reply)
    if reply.status == 200:
        assert_completion(reply, stream=body.get("stream") is True)


header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"),
    max_size=80,
)


@FUZZ
@given(value=header_text)
def test_any_authorization_value_is_401_or_accepted(live_edge: LiveEdge, value: str) -> None:
    request = http_request(
        "POST",
        "/v1/chat/completions",
        b"{}",
        raw_headers=b"Authorization: " + value.encode("latin-1") + b"\r\n",
    )
    reply = exchange(live_edge.port, request)
    assert_sane(reply)
    assert reply.status in {400, 401}


@FUZZ
@given(before=header_text, after=header_text, breaker=st.sampled_from([b"\r\n", b"\n", b"\r"]))
def test_header_injection_never_reaches_the_response(
    live_edge: LiveEdge, before: str, after: str, breaker: bytes
) -> None:
    injected = b"X-Injected: yes"
    raw = (
        b"X-Session-Id: "
        + before.encode("latin-1")
        + breaker
        + injected
        + after.encode("latin-1")
        + b"\r\n"
    )
    request = http_request(
        "POST",
        "/v1/chat/completions",
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode(),
        headers={"Authorization": f"Bearer {live_edge.key}"},
        raw_headers=raw,
    )
    reply = exchange(live_edge.port, request)
    assert_sane(reply)
    assert b"x-injected" not in reply.raw_head.lower()


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, "UTF-8"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', 400, "surrogate"),
        (b'{"model": "m", "messages": []}', 400, "messages"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
            400,
            "max_tokens",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}'
            b'], "max_tokens": 99999999999}',
            400,
            "max_tokens",
        ),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 17}', 400, "'n'"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}'
            b'], "tools": [{"type": "function",'
            b' "function": {"name": "f", "parameters": {"type": "objekt"}}}]}',
            400,
            "tools[0].function.parameters",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}'
            b', {"role": "tool", "content": "x",'
            b' "tool_call_id": "nope"}]}',
            400,
            "messages[1].tool_call_id",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}'
            b'], "response_format": {"type":'
            b' "json_schema", "json_schema": {"name": "x", "schema": {"minLength": -1}}}}',
            400,
            "response_format.json_schema.schema",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": true,'
            b' "stream_options": {"include_usage": true, "x": 1}}',
            400,
            "stream_options",
        ),
        (b'{"model": "m", "messages": [{"role": "robot"}]}', 400, "messages[0].role"),
        (b'{"model": "m", "messages": [{"role": "user"}]}', 400, "messages[0].content"),
        (b"x" * (5 * 1024 * 1024), 413, "larger than"),
    ],
)
def test_hostile_bodies_get_precise_errors(
    live_edge: LiveEdge, body: bytes, status: int, fragment: str
) -> None:
    reply = chat(live_edge, body)
    assert_sane(reply)
    assert reply.status == status
    assert fragment in json.loads(reply.body)["error"]["message"] + str(
        json.loads(reply.body)["error"]["param"]
    )


@pytest.mark.parametrize(
    ("key", "code"),
    [
        ("sk-proj-" + "a" * 40, "invalid_api_key"),
        ("mk-" + "a" * 42, "invalid_api_key"),
        ("mk-" + "a" * 43, "invalid_api_key"),
    ],
)
def test_keys_in_the_wrong_format_or_unknown_are_401(
    live_edge: LiveEdge, key: str, code: str
) -> None:
    reply = chat(live_edge, b'{"model": "m", "messages": [{"role": "user"}]}', key=key)
    assert reply.status == 401
    assert json.loads(reply.body)["error"]["code"] == code


def test_unknown_top_level_fields_are_ignored(live_edge: LiveEdge) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "metadata_from_the_future": {"a": 1},
    }
    reply = chat(live_edge, json.dumps(body).encode())
    assert reply.status == 200
    assert_completion(reply, stream=False)
