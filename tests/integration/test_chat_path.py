"""The whole path with the official OpenAI SDK: edge → router → worker, over real sockets."""

from __future__ import annotations

import io
import json
import time

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from services.edge.tenancy.tenants import Limits
from tests.integration.conftest import MODEL, Stack
from tests.support.wait import eventually


def client(stack: Stack, key: str | None = None) -> openai.AsyncOpenAI:
    """A client of the stack's edge; use it with ``async with`` so its connections close."""
    return openai.AsyncOpenAI(base_url=stack.base_url, api_key=key or stack.key, max_retries=0)


async def test_non_streaming_completion_has_text_usage_and_routing_headers(stack: Stack) -> None:
    async with client(stack) as c:
        raw = await c.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=5
        )
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 5
    assert completion.usage.prompt_tokens > 0
    assert raw.headers["x-meridian-region"] == "kr"  # nearest, all idle
    assert raw.headers["x-request-id"] == completion.id


async def test_streaming_completion_arrives_as_openai_chunks(stack: Stack) -> None:
    async with client(stack) as api:
        stream = await api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Stream please"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert len({c.id for c in chunks}) == 1


@pytest.mark.parametrize("obfuscation", [False, True])
async def test_stream_options_include_obfuscation_of_the_sdk_is_accepted(
    stack: Stack, obfuscation: bool
) -> None:
    """``stream_options.include_obfuscation`` is in the SDK's ``ChatCompletionStreamOptionsParam``
    (OpenAI's API): it was a 400 ("Extra inputs are not permitted"). It is accepted for both
    endpoints and changes nothing (Meridian sends no ``obfuscation`` field)."""
    async with client(stack) as api:
        stream = await api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Stream please"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True, "include_obfuscation": obfuscation},
        )
        chunks = [c async for c in stream]
        legacy = await api.completions.create(
            model=MODEL,
            prompt="Once",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True, "include_obfuscation": obfuscation},
        )
        pieces = [c async for c in legacy]
        with pytest.raises(openai.BadRequestError) as bad:
            await api.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "x"}],
                stream=True,
                extra_body={"stream_options": {"include_obfuscation": "no"}},
            )
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3
    assert pieces[-1].usage is not None
    assert pieces[-1].usage.completion_tokens == 3
    assert not any(getattr(c, "obfuscation", None) for c in chunks)
    assert bad.value.body["param"] == "stream_options.include_obfuscation"  # type: ignore[index]


async def test_raw_sse_ends_with_done(stack: Stack) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {stack.key}"},
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
                "max_tokens": 3,
            },
        ) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        body = (await resp.read()).decode()
    frames = [f for f in body.split("\n\n") if f]
    assert frames[-1] == "data: [DONE]"
    for frame in frames[:-1]:
        assert frame.startswith("data: ")
        json.loads(frame[6:])


async def test_same_seed_gives_same_text(stack: Stack) -> None:
    async def once() -> str:
        async with client(stack) as c:
            done = await c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "seeded"}],
                seed=42,
                max_tokens=12,
            )
        return done.choices[0].message.content or ""

    assert await once() == await once()


async def test_models_are_listed(stack: Stack) -> None:
    async with client(stack) as c:
        models = await c.models.list()
    assert [m.id for m in models.data] == [MODEL]


async def test_models_say_when_they_came_up_and_keep_saying_it(stack: Stack) -> None:
    now = time.time()
    async with client(stack) as c:
        first = await c.models.list()
        again = await c.models.retrieve(MODEL)
    created = first.data[0].created
    assert now - 3600 < created <= now  # when the stack's workers came up, not 0
    assert again.created == created  # stable while the fleet serves it


async def test_listing_models_counts_against_the_keys_request_limit(stack: Stack) -> None:
    """Each /v1/models call is one request of the key's rpm (it asks the router), with the
    usual headers, and a 429 past the limit; another key is not affected."""
    key = await stack.edge.new_key("lister", limits=Limits(rpm=2))
    async with client(stack, key) as c:
        listed = await c.models.with_raw_response.list()
        assert listed.headers["x-ratelimit-remaining-requests"] == "1"
        one = await c.models.with_raw_response.retrieve(MODEL)
        assert one.headers["x-ratelimit-remaining-requests"] == "0"
        with pytest.raises(openai.RateLimitError) as refused:
            await c.models.list()
    assert int(refused.value.response.headers["retry-after"]) > 0
    assert refused.value.response.headers["x-ratelimit-limit-requests"] == "2"
    async with client(stack) as other:
        assert [m.id for m in (await other.models.list()).data] == [MODEL]


async def session_detail(stack: Stack, request_id: str) -> str:
    """What the router's session-affinity scorer said of the worker it chose."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{stack.base_url}/explanations/{request_id}",
            headers={"Authorization": f"Bearer {stack.key}"},
        ) as resp,
    ):
        body = json.loads(await resp.read())
    (decision,) = body["decisions"]
    contributions = decision["candidates"][0]["contributions"]
    (session,) = [c for c in contributions if c["signal"] == "session-affinity"]
    return str(session["detail"])


async def test_a_prompt_cache_key_routes_its_requests_as_one_session(stack: Stack) -> None:
    """OpenAI's prompt_cache_key (chat and Responses) is the session the router's session
    affinity keeps on one worker, so the shared prefix is found in that worker's KV cache."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
    async with client(stack) as c:
        first = await c.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=2, prompt_cache_key="conv-7"
        )
        again = await c.responses.with_raw_response.create(
            model=MODEL, input="Hello", max_output_tokens=2, prompt_cache_key="conv-7"
        )
        plain = await c.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=2
        )
    assert await session_detail(stack, first.headers["x-request-id"]) == "new session"
    assert await session_detail(stack, again.headers["x-request-id"]) == "session here"
    assert again.headers["x-meridian-worker"] == first.headers["x-meridian-worker"]
    assert await session_detail(stack, plain.headers["x-request-id"]) == "no session"
    async with client(stack) as c:
        with pytest.raises(openai.BadRequestError) as bad:
            await c.chat.completions.create(
                model=MODEL, messages=messages, prompt_cache_key="k" * 1025
            )
    assert bad.value.body["param"] == "prompt_cache_key"  # type: ignore[index]


async def test_wrong_key_is_an_authentication_error(stack: Stack) -> None:
    async with client(stack, key="mk-" + "x" * 43) as c:
        with pytest.raises(openai.AuthenticationError):
            await c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            )
    async with client(stack, key="sk-not-ours") as c:
        with pytest.raises(openai.AuthenticationError):
            await c.models.list()


async def test_malformed_request_names_the_field(stack: Stack) -> None:
    async with client(stack) as c:
        with pytest.raises(openai.BadRequestError) as exc:
            await c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=7
            )
    assert "temperature" in str(exc.value)
    assert exc.value.body["param"] == "temperature"  # type: ignore[index]


async def test_unknown_model_is_not_found(stack: Stack) -> None:
    async with client(stack) as c:
        with pytest.raises(openai.NotFoundError) as exc:
            await c.chat.completions.create(
                model="gpt-nope", messages=[{"role": "user", "content": "hi"}]
            )
    assert exc.value.body["code"] == "model_not_found"  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{", 400, None),
        (b'{"model": "m"}', 400, "messages"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": 5}]}',
            400,
            "messages[0].content",
        ),
        (b"\xff", 400, None),
    ],
)
async def test_bad_bodies_get_openai_errors(
    stack: Stack, body: bytes, status: int, param: str | None
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {stack.key}", "Content-Type": "application/json"},
            data=body,
        ) as resp,
    ):
        assert resp.status == status
        err = (await resp.json())["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["param"] == param


async def test_oversized_body_is_413(stack: Stack) -> None:
    big = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]}
    )
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {stack.key}", "Content-Type": "application/json"},
            data=io.BytesIO(big.encode()),  # a file-like body: aiohttp streams it in chunks
        ) as resp,
    ):
        assert resp.status == 413
        assert (await resp.json())["error"]["code"] == "payload_too_large"


async def test_unknown_path_is_an_openai_404(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{stack.base_url}/nope") as resp:
        assert resp.status == 404
        assert "error" in await resp.json()


async def test_health_and_readiness(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{stack.edge.url}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"{stack.edge.url}/readyz") as resp:
            assert resp.status == 200
            assert (await resp.json())["checks"] == {"redis": True, "router": True}


async def test_client_disconnect_aborts_the_generation_on_the_worker(stack: Stack) -> None:
    kr = stack.workers["kr-1"]
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            f"{stack.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {stack.key}"},
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "long"}],
                "stream": True,
                "max_tokens": 5000,
                "ignore_eos": True,
            },
        )
        await resp.content.readuntil(b"\n\n")  # first chunk arrived
        assert kr.engine.load().running == 1
        resp.close()  # the client goes away
    await eventually(lambda: kr.engine.load().running == 0, timeout_s=2.0)
    assert kr.service.inflight == 0
