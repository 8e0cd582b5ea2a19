import json

import pytest

from services.common.errors import InvalidRequest
from services.edge.openai_types import parse_chat_request

OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def body(**over: object) -> bytes:
    return json.dumps({**OK, **over}).encode()


def test_a_minimal_request_parses() -> None:
    req = parse_chat_request(body())
    assert req.model == "m"
    assert req.messages[0].text() == "hi"
    assert not req.stream


def test_content_parts_are_joined() -> None:
    req = parse_chat_request(
        body(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ]
        )
    )
    assert req.messages[0].text() == "ab"


@pytest.mark.parametrize(
    ("raw", "param", "fragment"),
    [
        (b"{not json", None, "could not parse the JSON body"),
        (b"\xff\xfe", None, "UTF-8"),
        (b"[1, 2]", None, "JSON object"),
        (json.dumps({"messages": OK["messages"]}).encode(), "model", "Missing required"),
        (body(messages=[]), "messages", "messages"),
        (body(messages=[{"role": "robot", "content": "x"}]), "messages[0].role", "role"),
        (body(messages=[{"content": "x"}]), "messages[0].role", "Missing required"),
        (body(temperature=3), "temperature", "temperature"),
        (body(temperature="hot"), "temperature", "number"),
        (body(top_p=0), None, None),
        (body(max_tokens=0), "max_tokens", "max_tokens"),
        (body(max_tokens=-5), "max_tokens", "max_tokens"),
        (body(max_tokens=10**12), "max_tokens", "max_tokens"),
        (body(max_tokens="10"), "max_tokens", "max_tokens"),
        (body(n=200), "n", "n"),
        (body(n=0), "n", "n"),
        (body(stop=["a", "b", "c", "d", "e"]), "stop", "stop"),
        (body(stream="yes"), "stream", "stream"),
        (body(tools=[{"type": "function"}]), "tools[0].function", "Missing"),
        (body(top_logprobs=3), "top_logprobs", "logprobs"),
        (body(stream_options={"include_usage": True}), "stream_options", "stream"),
        (body(presence_penalty=5), "presence_penalty", "presence_penalty"),
    ],
)
def test_bad_requests_name_the_field(raw: bytes, param: str | None, fragment: str | None) -> None:
    if fragment is None:  # valid edge case
        parse_chat_request(raw)
        return
    with pytest.raises(InvalidRequest) as exc:
        parse_chat_request(raw)
    assert exc.value.param == param
    assert fragment.lower() in exc.value.message.lower()


def test_deeply_nested_json_is_a_clear_error_not_a_crash() -> None:
    raw = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(InvalidRequest):
        parse_chat_request(raw)


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    req = parse_chat_request(body(max_tokens=10, max_completion_tokens=20))
    assert req.effective_max_tokens() == 20


def test_stop_string_becomes_a_list() -> None:
    assert parse_chat_request(body(stop="END")).stop_list() == ["END"]


def test_lone_surrogate_escapes_are_refused() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    with pytest.raises(InvalidRequest) as exc:
        parse_chat_request(raw)
    assert exc.value.param == "messages[0].content"
