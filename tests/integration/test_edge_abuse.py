"""Abuse limits on the real path, each answered in OpenAI's format and counted: slow bodies,
too many messages, prompts too long, too many streams from one address, a client that stops
reading — and the counters on the admin port."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import threading
from collections.abc import AsyncIterator

import aiohttp
import pytest
from multidict import CIMultiDict

from services.edge.guard import GuardConfig
from services.edge.stages.validate import RequestLimits
from tests.integration.conftest import MODEL, Stack
from tests.support.builders import TEST_ADMIN_TOKEN, edge_config
from tests.support.inproc import RunningEdge, start_edge
from tests.support.rawhttp import exchange
from tests.support.wait import eventually


@pytest.fixture
async def strict(stack: Stack, redis_url: str) -> AsyncIterator[RunningEdge]:
    edge = await start_edge(
        redis_url=redis_url,
        router_address=stack.router.address,
        config=edge_config(
            guard=GuardConfig(body_timeout_s=0.3, write_timeout_s=0.5, max_streams_per_ip=2),
            request_limits=RequestLimits(max_messages=3, max_prompt_chars=100),
        ),
    )
    yield edge
    await edge.stop()


async def chat(edge: RunningEdge, key: str, body: object) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{edge.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json=body,
        ) as resp,
    ):
        return resp.status, (await resp.json())["error"]


async def test_a_body_that_arrives_too_slowly_is_408(strict: RunningEdge, stack: Stack) -> None:
    answer = await exchange(
        strict.url,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {stack.key}\r\nContent-Length: 500\r\n\r\n".encode()
        + b'{"model": ',
        timeout_s=5.0,
    )
    assert answer.status == 408
    assert strict.counters.body_timeouts == 1


@pytest.mark.parametrize(
    ("messages", "param", "code", "counter"),
    [
        ([{"role": "user", "content": "a"}] * 4, "messages", None, "too_many_messages"),
        (
            [{"role": "user", "content": "a" * 101}],
            "messages",
            "prompt_too_long",
            "prompts_too_long",
        ),
    ],
)
async def test_request_size_limits_are_400_naming_the_field(
    strict: RunningEdge,
    stack: Stack,
    messages: list[dict[str, str]],
    param: str,
    code: str | None,
    counter: str,
) -> None:
    status, error = await chat(strict, stack.key, {"model": MODEL, "messages": messages})
    assert status == 400
    assert (error["param"], error["code"]) == (param, code)
    assert getattr(strict.counters, counter) == 1


async def test_a_third_concurrent_stream_from_one_address_is_429(
    strict: RunningEdge, stack: Stack
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "max_tokens": 3000,
        "ignore_eos": True,
    }
    async with aiohttp.ClientSession() as http:
        held = [
            await http.post(
                f"{strict.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {stack.key}"},
                json=body,
            )
            for _ in range(2)
        ]
        assert [r.status for r in held] == [200, 200]
        status, error = await chat(strict, stack.key, body)
        assert status == 429
        assert "concurrent" in str(error["message"])
        for r in held:
            r.close()
    assert strict.counters.streams_refused_ip == 1


async def test_a_client_that_stops_reading_is_cut_off(strict: RunningEdge, stack: Stack) -> None:
    port = int(strict.url.rsplit(":", 1)[1])
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "max_tokens": 3500,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 20,  # large chunks, to fill the socket buffers quickly
        }
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {stack.key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await asyncio.get_running_loop().sock_sendall(sock, request)
    try:
        await eventually(lambda: strict.counters.write_timeouts >= 1, timeout_s=15.0)
        await eventually(lambda: strict.deps.streams.total == 0, timeout_s=5.0)
    finally:
        sock.close()
    worker = stack.workers["kr-1"]
    await eventually(lambda: worker.engine.load().running == 0, timeout_s=5.0)  # call cancelled


async def test_counters_are_on_the_admin_port(strict: RunningEdge, stack: Stack) -> None:
    await chat(strict, "mk-" + "A" * 43, {"model": MODEL, "messages": []})
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{strict.admin_url}/admin/stats",
            headers={"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"},
        ) as resp,
    ):
        stats = await resp.json()
    assert stats["counters"]["auth_invalid"] == 1
    assert stats["counters"]["connections_accepted"] >= 1


async def test_an_unknown_expectation_is_417_in_openais_format(
    strict: RunningEdge, stack: Stack
) -> None:
    """aiohttp answers ``Expect`` before any middleware, in plain text by default."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    for url in (f"{strict.url}/v1/chat/completions", f"{strict.admin_url}/admin/tenants"):
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                url,
                headers={
                    "Authorization": f"Bearer {stack.key}",
                    "Content-Type": "application/json",
                    "Expect": "x-teapot",
                },
                data=body,
            ) as resp,
        ):
            assert resp.status == 417, url
            error = (await resp.json())["error"]
        assert error["param"] == "Expect"
        assert "x-teapot" in error["message"]


async def test_expect_100_continue_still_gets_its_answer(stack: Stack) -> None:
    port = int(stack.edge.url.rsplit(":", 1)[1])
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {stack.key}\r\nContent-Length: {len(body)}\r\n".encode()
        + b"Expect: 100-continue\r\n\r\n"
    )
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    assert interim.startswith(b"HTTP/1.1 100 Continue")
    writer.write(body)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200"), head


async def test_a_request_too_big_for_a_worker_once_encoded_is_413_and_harms_no_one(
    stack: Stack,
) -> None:
    """0.9 MB of JSON under the body limit, 5 MB as a protobuf Struct: sent, it broke the
    GenerateMux call every stream to that worker shares, on every worker it was retried on,
    and ejected them all for failures."""
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"enum": [0] * 450_000}}},
        },
    }
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    raw = json.dumps(body, separators=(",", ":")).encode()
    for _ in range(4):  # more than failure-ejection's 3: nothing may count against a worker
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{stack.edge.url}/v1/chat/completions",
                headers={
                    "Authorization": f"Bearer {stack.key}",
                    "Content-Type": "application/json",
                },
                data=io.BytesIO(raw),
            ) as resp,
        ):
            status, error = resp.status, (await resp.json())["error"]
        assert status == 413
        assert error["param"] == "tools[0].function.parameters"
        assert "once encoded for a worker" in str(error["message"])
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.edge.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {stack.key}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        ) as resp,
    ):
        assert resp.status == 200


async def test_a_body_declared_over_the_limit_is_413_before_it_is_read(stack: Stack) -> None:
    """Content-Length over the body limit is refused at once: reading up to the limit first
    held such a request (the client sends little) until the body timeout."""
    answer = await exchange(
        stack.edge.url,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {stack.key}\r\nContent-Length: 50000000\r\n\r\n".encode()
        + b'{"model": ',
        timeout_s=5.0,
    )
    assert answer.status == 413, answer.head
    assert "request body is larger than" in json.loads(answer.body)["error"]["message"]


async def test_a_large_request_is_parsed_off_the_event_loop_and_served(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body of ~800 KB of tool schemas takes the offload thread, not the event loop (there,
    a few megabytes stalled every other stream of the process for a second), and reaches the
    worker from its prebuilt payload."""
    from services.edge.dialects.chat import ChatDialect

    threads: list[str] = []
    accept = ChatDialect.accept

    def spy(self: ChatDialect, *args: object, **kwargs: object) -> str:
        threads.append(threading.current_thread().name)
        return accept(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ChatDialect, "accept", spy)
    properties = {f"p{i}": {"type": "string", "description": "x"} for i in range(20_000)}
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": properties}},
    }
    big = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    small = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert len(json.dumps(big)) > 600_000
    invalid = {**big, "n": 0}
    before = stack.edge.counters.invalid_requests
    answers = []
    for body in (big, small, invalid):
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{stack.edge.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {stack.key}"},
                json=body,
            ) as resp,
        ):
            answers.append((resp.status, await resp.json()))
    # The worker counted the tools into the prompt (its own check: the edge's estimate does
    # not count them), so they reached it; "hi" alone fits.
    assert answers[0][0] == 400, answers[0]
    assert answers[0][1]["error"]["code"] == "context_length_exceeded"
    assert answers[1][0] == 200, answers[1]
    assert (answers[2][0], answers[2][1]["error"]["param"]) == (400, "n")
    assert stack.edge.counters.invalid_requests == before + 1  # counted in the thread, kept
    assert [t.startswith("edge-offload") for t in threads] == [True, False, True]


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ([("Authorization", "Basic dXNlcjpwYXNz")], "must use the Bearer scheme"),
        ([("Authorization", "Token abc")], "must use the Bearer scheme"),
        ([("Authorization", "Bearer ")], "You didn't provide an API key"),
        ([], "You didn't provide an API key"),
        ("two keys", "Send one Authorization header"),
    ],
)
async def test_an_authorization_header_the_edge_cannot_use_says_why(
    stack: Stack, headers: object, says: str
) -> None:
    if headers == "two keys":
        other = await stack.edge.new_key("second-payer")
        headers = [("Authorization", f"Bearer {stack.key}"), ("Authorization", f"Bearer {other}")]
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.edge.url}/v1/chat/completions",
            headers=CIMultiDict(headers),  # type: ignore[arg-type]
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        ) as resp,
    ):
        assert resp.status == 401
        error = (await resp.json())["error"]
    assert says in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("charset", "status"), [("utf-16", 415), ("latin-1", 415), ("UTF-8", 200)])
async def test_a_body_declared_in_a_charset_other_than_utf8_is_415(
    stack: Stack, charset: str, status: int
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.edge.url}/v1/chat/completions",
            headers={
                "Authorization": f"Bearer {stack.key}",
                "Content-Type": f"application/json; charset={charset}",
            },
            data=json.dumps(body).encode(),
        ) as resp,
    ):
        assert resp.status == status, await resp.text()
        if status == 415:
            error = (await resp.json())["error"]
            assert (error["code"], error["param"]) == ("unsupported_charset", "Content-Type")


@pytest.mark.parametrize(("coding", "status"), [(b"gzip, chunked", 501), (b"chunked", 200)])
async def test_a_transfer_coding_other_than_chunked_is_501(
    stack: Stack, coding: bytes, status: int
) -> None:
    """aiohttp de-chunks and ignores any other coding: gzip would reach the parser still
    compressed (RFC 9112: a transfer coding the server does not know is a 501)."""
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ).encode()
    answer = await exchange(
        stack.edge.url,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {stack.key}\r\n".encode()
        + b"Transfer-Encoding: "
        + coding
        + b"\r\nConnection: close\r\n\r\n"
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n",
    )
    assert answer.status == status, answer.head


async def test_a_large_non_streaming_answer_is_built_off_the_event_loop(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sixteen choices of 2,000 tokens with twenty alternatives each are 60 MB of JSON and
    seconds of Python: built and encoded on the loop, they stalled every other client of the
    edge for as long. The answer is the same either way."""
    from services.edge.stages import stream

    threads: list[str] = []
    build = stream.completion_body  # type: ignore[attr-defined]

    def spy(*args: object, **kwargs: object) -> dict[str, object]:
        threads.append(threading.current_thread().name)
        return build(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(stream, "completion_body", spy)
    asks = [
        {"max_tokens": 200, "n": 2, "logprobs": True, "top_logprobs": 20, "ignore_eos": True},
        {"max_tokens": 4, "logprobs": True, "top_logprobs": 2},
    ]
    for ask in asks:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{stack.edge.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {stack.key}"},
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **ask},
            ) as resp,
        ):
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
        assert len(answer["choices"]) == ask.get("n", 1)
        for c in answer["choices"]:
            assert len(c["logprobs"]["content"]) == ask["max_tokens"]
            assert all(
                len(e["top_logprobs"]) == ask["top_logprobs"] for e in c["logprobs"]["content"]
            )
    assert [t.startswith("edge-offload") for t in threads] == [True, False]


async def test_an_unparsable_request_line_says_what_is_wrong_without_echoing_it(
    stack: Stack,
) -> None:
    """aiohttp's message is several lines (what is wrong, then the bytes it read): the 400
    says the first two, not "Bad status line:" alone, and never the client's bytes."""
    port = int(stack.edge.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/models FOO/1.1\r\nHost: x\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(4096), 10.0)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400", head
    message = json.loads(body)["error"]["message"]
    assert message.startswith("The HTTP request could not be parsed: Bad status line: "), message
    assert len(message) > len("The HTTP request could not be parsed: Bad status line: ")
    assert "FOO" not in message
    assert "/v1/models" not in message


@pytest.mark.parametrize(
    ("request_line", "says"),
    [
        (b"GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n", "HTTP/2.0 is not supported"),
        (b"GET /v1/models HTTP/0.9\r\n\r\n", "HTTP/0.9 is not supported"),
        (b"GET /v1/models\r\n\r\n", "HTTP/0.9 is not supported"),  # no version: 0.9's form
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/2 connection preface"),  # h2c
        (b"GET /v1/models HTTP/1.2\r\nHost: x\r\n\r\n", "HTTP/1.2 is not supported"),
        (b"GET /v1/models HTTP/3.0\r\nHost: x\r\n\r\n", "HTTP/3.0 is not supported"),
    ],
)
async def test_an_http_version_the_edge_does_not_speak_is_505_saying_so(
    stack: Stack, request_line: bytes, says: str
) -> None:
    """aiohttp parses these as if they were HTTP/1 (the preface stops its parser with a
    message of its own): before, a 401 or a 400 "Pause on PRI/Upgrade"."""
    port = int(stack.edge.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_line)
    answer = await asyncio.wait_for(reader.read(4096), 10.0)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"505", head
    error = json.loads(body)["error"]
    assert says in error["message"]
    assert error["code"] == "http_version_not_supported"
    assert error["type"] == "invalid_request_error"
