"""A first token slower than ``keepalive_after_s``: the edge commits the SSE headers at once
(a proxy or client waiting for them does not time out) and the stream that follows is whole;
a failure after the headers went out is an error event and ``[DONE]``, not a cut connection.
For chat and for text completions of several prompts (each choice its own worker stream)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
import pytest

from services.edge.upstream.failover import FailoverPolicy
from tests.integration.conftest import MODEL, Stack, start_stack, stop_stack
from tests.support.builders import edge_config

KEEPALIVE_AFTER_S = 0.2
# The simulated prefill: 1 ms per prompt token (5 ms x time_scale 0.2), so PROMPT's ~600
# tokens take ~0.6 s to a first token, three times KEEPALIVE_AFTER_S.
PROMPT = "word " * 600


@dataclass
class Seen:
    status: int = 0
    headers_after_s: float = 0.0
    first_data_after_s: float | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False


async def post_stream(stack: Stack, path: str, body: dict[str, Any]) -> Seen:
    seen = Seen()
    start = time.monotonic()
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.base_url}/{path}",
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
            headers={"Authorization": f"Bearer {stack.key}"},
        ) as resp,
    ):
        seen.status = resp.status
        seen.headers_after_s = time.monotonic() - start
        async for line in resp.content:
            text = line.decode().strip()
            if not text.startswith("data: "):
                continue
            if seen.first_data_after_s is None:
                seen.first_data_after_s = time.monotonic() - start
            if text == "data: [DONE]":
                seen.done = True
            else:
                seen.events.append(json.loads(text[6:]))
    return seen


@pytest.fixture
async def slow_stack(redis_url: str) -> AsyncIterator[Stack]:
    s = await start_stack(
        redis_url,
        edge_config=edge_config(keepalive_after_s=KEEPALIVE_AFTER_S),
        prefill_ms_per_token=5.0,
    )
    yield s
    await stop_stack(s)


@pytest.fixture
async def impatient_stack(redis_url: str) -> AsyncIterator[Stack]:
    """Every worker is slower to a first token than the edge waits for one."""
    s = await start_stack(
        redis_url,
        edge_config=edge_config(
            keepalive_after_s=KEEPALIVE_AFTER_S,
            failover=FailoverPolicy(first_token_timeout_s=0.3, max_attempts=2),
        ),
        prefill_ms_per_token=5.0,
    )
    yield s
    await stop_stack(s)


def assert_headers_came_first(seen: Seen) -> None:
    assert seen.status == 200
    assert seen.first_data_after_s is not None
    # the headers did not wait for the first token
    assert seen.first_data_after_s - seen.headers_after_s > KEEPALIVE_AFTER_S


async def test_a_slow_first_chat_token_gets_headers_early_and_a_whole_stream(
    slow_stack: Stack,
) -> None:
    seen = await post_stream(
        slow_stack,
        "chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 12,
            "ignore_eos": True,  # the sim may end early (EOS) otherwise: 12 tokens every time
        },
    )
    assert_headers_came_first(seen)
    assert seen.done
    assert not [e for e in seen.events if "error" in e]
    content = [c["delta"].get("content") or "" for e in seen.events for c in e["choices"]]
    finishes = [c["finish_reason"] for e in seen.events for c in e["choices"] if c["finish_reason"]]
    usage = seen.events[-1]["usage"]
    assert finishes == ["length"]
    assert usage["completion_tokens"] == 12
    assert usage["prompt_tokens"] > 500
    assert "".join(content)


async def test_slow_first_tokens_of_several_completion_prompts_get_headers_early(
    slow_stack: Stack,
) -> None:
    seen = await post_stream(
        slow_stack,
        "completions",
        {"model": MODEL, "prompt": [PROMPT, PROMPT], "max_tokens": 6, "ignore_eos": True},
    )
    assert_headers_came_first(seen)
    assert seen.done
    assert not [e for e in seen.events if "error" in e]
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for e in seen.events:
        for c in e["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
            if c["finish_reason"]:
                finishes[c["index"]] = c["finish_reason"]
    assert finishes == {0: "length", 1: "length"}
    assert all(texts[i] for i in (0, 1))
    assert seen.events[-1]["usage"]["completion_tokens"] == 12  # both choices'


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}),
        ("completions", {"prompt": [PROMPT, PROMPT]}),
    ],
    ids=["chat", "two completion prompts"],
)
async def test_a_failure_after_the_headers_went_out_is_an_error_event_and_done(
    impatient_stack: Stack, path: str, body: dict[str, Any]
) -> None:
    seen = await post_stream(impatient_stack, path, {"model": MODEL, "max_tokens": 4, **body})
    assert seen.status == 200  # committed before the failure was known
    assert seen.headers_after_s < 0.3 * 2 + KEEPALIVE_AFTER_S
    assert seen.done
    errors = [e["error"] for e in seen.events if "error" in e]
    assert len(errors) == 1, seen.events
    assert errors[0]["code"] == "unavailable"
    assert "did not produce a first token in time" in errors[0]["message"]
    assert not [e for e in seen.events if "choices" in e]  # no token before the error
    assert impatient_stack.edge.counters.stream_errors == 1


@pytest.fixture
async def chatty_stack(redis_url: str) -> AsyncIterator[Stack]:
    """Keep-alive comments every 0.1 s once the headers went out (the default is 10 s)."""
    s = await start_stack(
        redis_url,
        edge_config=edge_config(keepalive_after_s=KEEPALIVE_AFTER_S, keepalive_every_s=0.1),
        prefill_ms_per_token=5.0,
    )
    yield s
    await stop_stack(s)


async def test_keepalive_comments_come_as_often_as_configured_until_the_first_token(
    chatty_stack: Stack,
) -> None:
    """A proxy whose idle timeout is shorter than the default 10 s needs them more often:
    ``keepalive_every_s`` (``--sse-keepalive-every-s``) sets it."""
    comments = 0
    first_data: float | None = None
    start = time.monotonic()
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{chatty_stack.base_url}/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 4,
                "stream": True,
            },
            headers={"Authorization": f"Bearer {chatty_stack.key}"},
        ) as resp,
    ):
        assert resp.status == 200
        async for line in resp.content:
            text = line.decode().strip()
            if text.startswith(":") and first_data is None:
                comments += 1
            elif text.startswith("data: ") and first_data is None:
                first_data = time.monotonic() - start
    assert first_data is not None
    # one comment when the headers go out (0.2 s), then one each 0.1 s until the first token
    # (~0.6 s): at the 10-s default there would be just the first
    assert comments >= 3, (comments, first_data)


async def test_a_responses_failure_after_the_headers_is_openais_error_then_response_failed(
    impatient_stack: Stack,
) -> None:
    """The Responses shape of the same failure: ``response.created``, ``in_progress``, an
    ``error`` event, ``response.failed`` (chat's ``data: {"error"}`` and ``[DONE]`` are not
    typed events); the SDK yields them as its own event types."""
    events: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{impatient_stack.base_url}/responses",
            json={"model": MODEL, "input": PROMPT, "max_output_tokens": 4, "stream": True},
            headers={"Authorization": f"Bearer {impatient_stack.key}"},
        ) as resp,
    ):
        assert resp.status == 200  # committed before the failure was known
        kind = None
        async for line in resp.content:
            text = line.decode().strip()
            if text.startswith("event: "):
                kind = text[7:]
            elif text.startswith("data: "):
                payload = json.loads(text[6:])
                assert payload["type"] == kind
                events.append(payload)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    assert [e["sequence_number"] for e in events] == [0, 1, 2, 3]
    assert events[2]["code"] == "unavailable"
    assert events[3]["response"]["status"] == "failed"
    assert "did not produce a first token in time" in events[3]["response"]["error"]["message"]

    sdk = openai.AsyncOpenAI(
        base_url=impatient_stack.base_url, api_key=impatient_stack.key, max_retries=0
    )
    async with sdk:
        stream = await sdk.responses.create(
            model=MODEL, input=PROMPT, max_output_tokens=4, stream=True
        )
        seen = [event async for event in stream]
    # the SDK gives the failure as OpenAI's typed events, the last one the failed response
    assert [e.type for e in seen] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    assert isinstance(seen[-1], openai.types.responses.ResponseFailedEvent)
    assert seen[-1].response.error is not None
    assert "did not produce a first token in time" in seen[-1].response.error.message
