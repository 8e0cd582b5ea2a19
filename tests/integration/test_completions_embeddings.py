"""POST /v1/completions and POST /v1/embeddings on the whole path (edge → router → SimEngine
workers, real sockets), through the official OpenAI SDK where it has a call for it."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import aiohttp
import openai
import pytest

from services.edge.tenancy.tenants import Limits
from tests.integration.conftest import MODEL, Stack, start_stack, stop_stack


def client(stack: Stack, key: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.base_url, api_key=key or stack.key, max_retries=0)


async def post(stack: Stack, path: str, body: dict[str, Any], key: str | None = None) -> Any:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.base_url}/{path}",
            headers={"Authorization": f"Bearer {key or stack.key}"},
            json=body,
        ) as resp,
    ):
        return resp.status, resp.headers, await resp.read()


async def get(stack: Stack, path: str) -> Any:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{stack.base_url}/{path}", headers={"Authorization": f"Bearer {stack.key}"}
        ) as resp,
    ):
        return resp.status, resp.headers, await resp.read()


# -- completions -------------------------------------------------------------------------------


async def test_a_text_completion_has_text_usage_and_the_openai_shape(stack: Stack) -> None:
    async with client(stack) as c:
        raw = await c.completions.with_raw_response.create(
            model=MODEL, prompt="Once upon a time", max_tokens=5
        )
    done = raw.parse()
    assert done.object == "text_completion"
    assert done.id.startswith("cmpl-")
    assert raw.headers["x-request-id"] == done.id
    (only,) = done.choices
    assert only.index == 0
    assert only.text
    assert only.finish_reason == "length"
    assert only.logprobs is None
    assert done.usage is not None
    assert done.usage.completion_tokens == 5
    assert done.usage.prompt_tokens > 0
    assert done.usage.total_tokens == done.usage.prompt_tokens + 5


async def test_a_completion_without_max_tokens_stops_at_sixteen_as_openais_does(
    stack: Stack,
) -> None:
    async with client(stack) as c:
        done = await c.completions.create(
            model=MODEL, prompt="Once upon a time", extra_body={"ignore_eos": True}
        )
    assert done.usage is not None
    assert done.usage.completion_tokens == 16
    assert done.choices[0].finish_reason == "length"


async def test_a_streamed_completion_arrives_as_chunks_then_usage(stack: Stack) -> None:
    async with client(stack) as c:
        stream = await c.completions.create(
            model=MODEL,
            prompt="Stream me",
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [x async for x in stream]
    assert {x.object for x in chunks} == {"text_completion"}
    assert len({x.id for x in chunks}) == 1
    text = "".join(x.choices[0].text for x in chunks if x.choices)
    assert text
    finishes = [x.choices[0].finish_reason for x in chunks if x.choices]
    assert finishes[-1] == "length"
    assert all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6


async def test_the_raw_completion_stream_ends_with_done(stack: Stack) -> None:
    status, headers, body = await post(
        stack, "completions", {"model": MODEL, "prompt": "x", "stream": True, "max_tokens": 3}
    )
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    frames = [f for f in body.decode().split("\n\n") if f]
    assert frames[-1] == "data: [DONE]"


async def test_echo_with_logprobs_returns_the_prompt_and_its_token_logprobs(stack: Stack) -> None:
    prompt = "The quick brown fox"
    async with client(stack) as c:
        done = await c.completions.create(
            model=MODEL, prompt=prompt, max_tokens=4, echo=True, logprobs=2, temperature=0
        )
    (only,) = done.choices
    assert only.text.startswith(prompt)
    lp = only.logprobs
    assert lp is not None
    assert lp.tokens is not None
    assert lp.token_logprobs is not None
    assert lp.text_offset is not None
    assert lp.top_logprobs is not None
    assert "".join(lp.tokens) == only.text
    token_logprobs: list[Any] = list(lp.token_logprobs)  # the SDK's type omits null
    top_logprobs: list[Any] = list(lp.top_logprobs)
    assert token_logprobs[0] is None  # nothing precedes the first prompt token
    assert top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in token_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[0] == 0
    # The top 2 and the sampled token: up to logprobs + 1 entries, always the sampled one.
    assert all(t is not None and 1 <= len(t) <= 3 for t in top_logprobs[1:])
    assert all(tok in top for tok, top in zip(lp.tokens[1:], top_logprobs[1:], strict=True))
    assert len(lp.tokens) == done.usage.prompt_tokens + 4 if done.usage else False


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_echoed_long_prompts_with_20_logprobs_arrive_whole(
    stack: Stack, stream: bool
) -> None:
    """Four ~6,800-token prompts echoed with 20 alternatives per token: ~1.6 MB of logprobs
    each, ~6.4 MB at once, which the worker sends in pieces (test_worker_mux.py shows the
    call it broke): the client gets every prompt token's logprobs, null for the first only."""
    prompts = [" ".join(f"{c}{i}" for i in range(2600)) for c in "wxyz"]
    async with client(stack) as c:
        if stream:
            chunks = [
                x
                async for x in await c.completions.create(
                    model=MODEL,
                    prompt=prompts,
                    max_tokens=4,
                    echo=True,
                    logprobs=20,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            ]
            usage = chunks[-1].usage
            by_index: dict[int, dict[str, list[Any]]] = {}
            for x in chunks:
                for ch in x.choices:
                    got = by_index.setdefault(ch.index, {"text": [], "tokens": [], "lps": []})
                    got["text"].append(ch.text)
                    if ch.logprobs is not None:
                        got["tokens"].extend(ch.logprobs.tokens or [])
                        got["lps"].extend(ch.logprobs.token_logprobs or [])
            texts = {i: "".join(g["text"]) for i, g in by_index.items()}
            tokens = {i: g["tokens"] for i, g in by_index.items()}
            logprobs = {i: g["lps"] for i, g in by_index.items()}
        else:
            done = await c.completions.create(
                model=MODEL, prompt=prompts, max_tokens=4, echo=True, logprobs=20
            )
            usage = done.usage
            texts = {ch.index: ch.text for ch in done.choices}
            tokens = {
                ch.index: list(ch.logprobs.tokens or []) for ch in done.choices if ch.logprobs
            }
            logprobs = {
                ch.index: list(ch.logprobs.token_logprobs or [])
                for ch in done.choices
                if ch.logprobs
            }
    assert usage is not None
    assert sorted(texts) == [0, 1, 2, 3]
    for i in range(4):
        assert texts[i].startswith(prompts[i])
        assert "".join(tokens[i]) == texts[i]
        assert logprobs[i][0] is None  # the first prompt token only
        assert None not in logprobs[i][1:]
    assert sum(len(t) for t in tokens.values()) == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens > 4 * 6500


@pytest.mark.parametrize("logprobs", [0, 3])
async def test_echo_with_zero_max_tokens_scores_the_prompt_and_generates_nothing(
    stack: Stack, logprobs: int
) -> None:
    # How lm-evaluation-harness asks for a prompt's loglikelihood.
    prompt = "Paris is the capital of France"
    async with client(stack) as c:
        done = await c.completions.create(
            model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=logprobs
        )
    (only,) = done.choices
    assert only.text == prompt
    assert only.finish_reason == "length"
    lp = only.logprobs
    assert lp is not None
    assert lp.tokens is not None
    assert lp.token_logprobs is not None
    assert "".join(lp.tokens) == prompt
    token_logprobs: list[Any] = list(lp.token_logprobs)
    assert token_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in token_logprobs[1:])
    assert done.usage is not None
    assert done.usage.completion_tokens == 0
    assert done.usage.prompt_tokens == len(lp.tokens)


async def test_a_streamed_echo_with_zero_max_tokens_streams_the_prompt_only(stack: Stack) -> None:
    prompt = "score me"
    async with client(stack) as c:
        stream = await c.completions.create(
            model=MODEL,
            prompt=[prompt, "and me"],
            max_tokens=0,
            echo=True,
            logprobs=1,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [x async for x in stream]
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for x in chunks:
        for ch in x.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            finish: str | None = ch.finish_reason  # the SDK's type omits null (streamed)
            if finish:
                finishes[ch.index] = finish
    assert texts == {0: prompt, 1: "and me"}
    assert finishes == {0: "length", 1: "length"}
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == 0


async def test_a_streamed_echo_starts_with_the_prompt(stack: Stack) -> None:
    async with client(stack) as c:
        stream = await c.completions.create(
            model=MODEL, prompt="Echo this", max_tokens=3, echo=True, stream=True, logprobs=0
        )
        chunks = [x async for x in stream]
    assert chunks[0].choices[0].text.startswith("Echo this")
    tokens = [
        t
        for x in chunks
        if x.choices and x.choices[0].logprobs
        for t in x.choices[0].logprobs.tokens or []
    ]
    assert "".join(tokens) == "".join(x.choices[0].text for x in chunks if x.choices)
    tops: list[Any] = [
        top
        for x in chunks
        if x.choices and x.choices[0].logprobs
        for top in x.choices[0].logprobs.top_logprobs or []
    ]
    assert tops[0] is None  # the prompt's first token
    # logprobs: 0 is the sampled token's own logprob, as OpenAI and vLLM give it.
    assert [list(top) for top in tops[1:]] == [[t] for t in tokens[1:]]


async def test_token_id_prompts_and_a_list_of_prompts_give_one_choice_each(stack: Stack) -> None:
    async with client(stack) as c:
        by_ids = await c.completions.create(model=MODEL, prompt=[11, 22, 33], max_tokens=2)
        several = await c.completions.create(
            model=MODEL, prompt=["first prompt", "second prompt", "third"], max_tokens=3
        )
        id_lists = await c.completions.create(model=MODEL, prompt=[[5, 6], [7]], max_tokens=1)
    assert by_ids.usage is not None
    assert by_ids.usage.prompt_tokens == 3
    assert [ch.index for ch in several.choices] == [0, 1, 2]
    assert all(ch.text for ch in several.choices)
    assert several.usage is not None
    assert several.usage.completion_tokens == 9
    assert [ch.index for ch in id_lists.choices] == [0, 1]
    assert id_lists.usage is not None
    assert id_lists.usage.prompt_tokens == 3


async def test_streamed_choices_of_several_prompts_carry_their_index(stack: Stack) -> None:
    async with client(stack) as c:
        stream = await c.completions.create(
            model=MODEL, prompt=["a b c", "d e f"], max_tokens=4, stream=True
        )
        chunks = [x async for x in stream]
    finished = {x.choices[0].index for x in chunks if x.choices and x.choices[0].finish_reason}
    assert finished == {0, 1}


async def test_n_choices_per_prompt_are_indexed_prompt_major_with_usage_per_prompt(
    stack: Stack,
) -> None:
    """``n`` choices of each prompt, choice j of prompt i at index i·n + j (as OpenAI and vLLM
    number them), each its own sample; a prompt's tokens count once in usage, however many
    choices it has."""
    async with client(stack) as c:
        alone = [
            await c.completions.create(model=MODEL, prompt=p, max_tokens=6)
            for p in ("the same prompt", "another one")
        ]
        many = await c.completions.create(
            model=MODEL, prompt=["the same prompt", "another one"], n=3, max_tokens=6
        )
    assert [ch.index for ch in many.choices] == list(range(6))
    assert len({ch.text for ch in many.choices[:3]}) == 3, "each choice is its own sample"
    assert many.usage is not None
    assert many.usage.completion_tokens == 6 * 6
    prompt_tokens = [a.usage.prompt_tokens for a in alone if a.usage is not None]
    assert many.usage.prompt_tokens == sum(prompt_tokens), "each prompt counted once"


async def test_seeded_choices_differ_from_each_other_and_repeat_exactly(stack: Stack) -> None:
    """With a seed, choice j samples with seed + j (as vLLM seeds its n children): the n
    choices differ, the same request gives the same n again, and choice 0 is the n=1 answer."""
    async with client(stack) as c:
        ask = dict(model=MODEL, prompt="seeded", max_tokens=8, temperature=1.0, seed=41)
        first = await c.completions.create(**ask, n=3)  # type: ignore[call-overload]
        again = await c.completions.create(**ask, n=3)  # type: ignore[call-overload]
        alone = await c.completions.create(**ask)  # type: ignore[call-overload]
        next_seed = await c.completions.create(**{**ask, "seed": 42})  # type: ignore[call-overload]
    texts = [ch.text for ch in first.choices]
    assert texts == [ch.text for ch in again.choices]
    assert len(set(texts)) == 3
    assert texts[0] == alone.choices[0].text
    assert texts[1] == next_seed.choices[0].text


async def test_streamed_n_choices_each_finish_with_their_own_text_and_usage(stack: Stack) -> None:
    async with client(stack) as c:
        stream = await c.completions.create(
            model=MODEL,
            prompt=["a b c", "d e f"],
            n=2,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=1,
        )
        chunks = [x async for x in stream]
    texts: dict[int, str] = {}
    tokens: dict[int, int] = {}
    finished: set[int] = set()
    for x in chunks:
        for ch in x.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.logprobs is not None:
                tokens[ch.index] = tokens.get(ch.index, 0) + len(ch.logprobs.tokens or [])
            if ch.finish_reason:
                finished.add(ch.index)
    assert finished == {0, 1, 2, 3}
    assert all(texts[i] for i in range(4))
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == sum(tokens.values()) == 16


async def test_best_of_equal_to_n_is_served(stack: Stack) -> None:
    async with client(stack) as c:
        answer = await c.completions.create(model=MODEL, prompt="x", n=2, best_of=2, max_tokens=3)
    assert [ch.index for ch in answer.choices] == [0, 1]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "best_of": 3}, "best_of"),  # more candidates than n: not ranked here
        ({"prompt": "x", "n": 3, "best_of": 2}, "best_of"),  # fewer than n
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "n": 17}, "n"),  # the stack's --max-choices (16)
        ({"prompt": ["x"] * 9, "n": 8}, "n"),  # 72 choices: more than MAX_COMPLETION_CHOICES
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["ok", ""]}, "prompt[1]"),
        ({"prompt": [[1, 2], []]}, "prompt[1]"),
        ({"prompt": [1, "a"]}, "prompt[1]"),
        ({"prompt": ["a", [1, 2]]}, "prompt[1]"),
        ({"prompt": []}, "prompt"),
        ({}, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),  # 0 only with echo
        ({"prompt": "x", "max_tokens": 0, "echo": False}, "max_tokens"),
        ({"prompt": "x", "logit_bias": "garbage"}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias.5"),
        ({"prompt": "x", "logit_bias": {"5": "1"}}, "logit_bias.5"),
        ({"prompt": "x", "tools": [{"type": "function"}]}, "tools"),
        ({"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
        ({"prompt": "x", "functions": [1]}, "functions"),
        ({"prompt": "x", "messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ],
)
async def test_bad_completion_requests_are_400s_naming_the_field(
    stack: Stack, body: dict[str, Any], param: str
) -> None:
    status, _, raw = await post(stack, "completions", {"model": MODEL, **body})
    assert status == 400, raw
    assert openai_error(raw)["param"] == param


# -- embeddings --------------------------------------------------------------------------------


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


async def test_float_embeddings_are_deterministic_unit_vectors(stack: Stack) -> None:
    async with client(stack) as c:
        raw = await c.embeddings.with_raw_response.create(
            model=MODEL,
            input=["hello world", "hello world", "something else"],
            encoding_format="float",
        )
    done = raw.parse()
    assert done.object == "list"
    assert [d.index for d in done.data] == [0, 1, 2]
    a, b, other = (d.embedding for d in done.data)
    assert len(a) == 256
    assert norm(a) == pytest.approx(1.0, abs=1e-5)
    assert a == b
    assert a != other
    assert done.usage.prompt_tokens == done.usage.total_tokens > 0
    assert raw.headers["x-request-id"].startswith("embd-")
    assert raw.headers["x-meridian-region"] in {"kr", "jp", "us"}


async def test_base64_embeddings_are_the_same_little_endian_floats(stack: Stack) -> None:
    async with client(stack) as c:
        floats = await c.embeddings.create(model=MODEL, input="vectors", encoding_format="float")
        encoded = await c.embeddings.create(model=MODEL, input="vectors", encoding_format="base64")
        default = await c.embeddings.create(model=MODEL, input="vectors")  # SDK: base64, decoded
    raw: Any = encoded.data[0].embedding  # the SDK types it as floats; base64 asked: a str
    assert isinstance(raw, str)
    blob = base64.b64decode(raw)
    decoded = list(struct.unpack(f"<{len(blob) // 4}f", blob))
    assert decoded == pytest.approx(floats.data[0].embedding, abs=1e-7)
    assert default.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-7)


async def test_dimensions_truncate_and_renormalise(stack: Stack) -> None:
    async with client(stack) as c:
        full = await c.embeddings.create(model=MODEL, input=[[1, 2, 3]], encoding_format="float")
        short = await c.embeddings.create(
            model=MODEL, input=[[1, 2, 3]], dimensions=32, encoding_format="float"
        )
    head = full.data[0].embedding[:32]
    v = short.data[0].embedding
    assert len(v) == 32
    assert norm(v) == pytest.approx(1.0, abs=1e-5)
    assert v == pytest.approx([x / norm(head) for x in head], abs=1e-5)
    assert full.usage.prompt_tokens == 3


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ["a", "b", "c", ""]}, "input[3]"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [[1], []]}, "input[1]"),
        ({"input": ["ok", "x" * 100_001]}, "input[1]"),
        ({"input": ["x"] * 2049}, "input"),
        ({"input": [{"text": "x"}]}, "input[0]"),
        ({"input": [[1], "a"]}, "input[1]"),  # strings or token-id lists, not both
        ({"input": ["a", "b", [1, 2]]}, "input[2]"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 1000}, "dimensions"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
    ],
)
async def test_bad_embedding_requests_are_400s_naming_the_field(
    stack: Stack, body: dict[str, Any], param: str
) -> None:
    status, _, raw = await post(stack, "embeddings", {"model": MODEL, **body})
    assert status == 400, raw
    assert openai_error(raw)["param"] == param


async def test_embeddings_count_their_input_tokens_against_the_token_limit(
    stack: Stack,
) -> None:
    key = await stack.edge.new_key("embed-metered", limits=Limits(tpm=250))
    ids = list(range(1, 101))  # exactly 100 tokens, no completion
    answers = [
        await post(stack, "embeddings", {"model": MODEL, "input": [ids]}, key) for _ in range(3)
    ]
    assert [a[0] for a in answers] == [200, 200, 429]
    assert answers[1][1]["x-ratelimit-remaining-tokens"] == "50"


async def test_models_list_shows_each_models_capabilities(stack: Stack) -> None:
    async with client(stack) as c:
        models = await c.models.list()
    (m,) = [x for x in models.data if x.id == MODEL]
    caps = m.model_extra["capabilities"] if m.model_extra else {}
    assert caps["chat"] is True
    assert caps["completions"] is True
    assert caps["embeddings"] is True
    assert caps["embedding_dimensions"] == 256
    assert caps["tools"] is True  # SimEngine scripts tool calls (issue 12 part A)
    assert caps["structured_outputs"] is True
    assert caps["max_n"] >= 16


def openai_error(raw: bytes) -> dict[str, Any]:
    err: dict[str, Any] = json.loads(raw)["error"]
    return err


# -- capabilities no worker has ------------------------------------------------------------------


async def test_a_feature_no_worker_has_is_a_400_naming_it_not_a_503(redis_url: str) -> None:
    stack = await start_stack(redis_url, embeddings=False, completions=False)
    try:
        async with client(stack) as c:
            with pytest.raises(openai.BadRequestError) as embed_err:
                await c.embeddings.create(model=MODEL, input="x")
            request_id = embed_err.value.response.headers["x-request-id"]
            status, _, raw = await get(stack, f"explanations/{request_id}")
            with pytest.raises(openai.BadRequestError) as complete_err:
                await c.completions.create(model=MODEL, prompt="x", max_tokens=2)
            chat = await c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "still fine"}], max_tokens=2
            )
    finally:
        await stop_stack(stack)
    # The router's explanation shows the capability filter's verdict on every worker.
    assert status == 200, raw
    (decision,) = json.loads(raw)["decisions"]
    assert decision["empty_reason"] == "unsupported"
    assert {f["filter"] for f in decision["filtered"]} == {"capability"}
    assert all("does not serve embeddings" in f["reason"] for f in decision["filtered"])
    body = embed_err.value.body
    assert isinstance(body, dict)
    assert body["param"] == "input"
    assert body["code"] == "unsupported_capability"
    assert "embeddings" in body["message"]
    cbody = complete_err.value.body
    assert isinstance(cbody, dict)
    assert cbody["param"] == "prompt"
    assert chat.choices[0].message.content
