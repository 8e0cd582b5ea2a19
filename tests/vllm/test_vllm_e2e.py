"""The whole path on the real engine: OpenAI SDK → edge → router → worker → vLLM (CPU build).

One stack for the module, in front of the session's engine (tests/vllm/inproc.py). The tiny
model's text is noise, so every check compares the path with the engine itself: the same
greedy request run straight on the engine gives the text and the counts the client must see.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletionMessageParam
from transformers import AutoTokenizer

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common.errors import CODE_KEY, PARAM_KEY
from services.common.grpcutil import insecure_channel
from services.worker.engine import ChatTurn, EngineOutput, EngineRequest, SamplingOptions
from services.worker.vllm.engine import VllmEngine
from tests.support.redis_proc import RedisProcess
from tests.support.wait import eventually
from tests.vllm.conftest import SERVED_NAME
from tests.vllm.inproc import VllmStack, start_vllm_stack
from tests.vllm.steps import MAX_STEPS_TO_ABORT_THROUGH_THE_STACK, StepCounter

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me a story about the edge."},
]
# Greedy and to the token limit: pass with temperature=0.0, extra_body=IGNORE_EOS.
IGNORE_EOS = {"ignore_eos": True}
LONG_PROMPT = "word " * 300  # > 256 tokens: the tiny model's context under VllmConfig.cpu_test


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(engine: VllmEngine, redis_process: RedisProcess) -> AsyncIterator[VllmStack]:
    s = await start_vllm_stack(engine, redis_url=redis_process.url)
    yield s
    await s.stop()


@pytest.fixture(scope="module")
def prompt_tokens(tiny_model_dir: Path) -> int:
    """MESSAGES under the model's chat template, counted by the model's own tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    return len(ids["input_ids"])


def turn(message: ChatCompletionMessageParam) -> ChatTurn:
    """One of MESSAGES as the engine takes it (they all have plain-text content)."""
    content = message.get("content")
    assert isinstance(content, str), message
    return ChatTurn(role=message["role"], content=content)


async def on_engine(engine: VllmEngine, max_tokens: int) -> list[EngineOutput]:
    """MESSAGES, greedy, straight on the engine (no edge, router or worker server)."""
    request = EngineRequest(
        request_id=f"direct-{uuid.uuid4().hex}",
        model=SERVED_NAME,
        messages=tuple(turn(m) for m in MESSAGES),
        sampling=SamplingOptions(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
    )
    async with aclosing(engine.generate(request)) as stream:
        return [output async for output in stream]


async def test_non_streaming_chat_returns_the_engines_text_and_counts(
    stack: VllmStack, engine: VllmEngine, prompt_tokens: int
) -> None:
    done = await stack.client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=24, temperature=0.0, extra_body=IGNORE_EOS
    )
    direct = await on_engine(engine, max_tokens=24)

    choice = done.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "".join(o.text for o in direct)
    assert choice.finish_reason == "length"
    assert done.model == SERVED_NAME
    assert done.usage is not None
    assert done.usage.prompt_tokens == direct[-1].prompt_tokens == prompt_tokens
    assert done.usage.completion_tokens == direct[-1].completion_tokens == 24
    assert done.usage.total_tokens == prompt_tokens + 24


async def test_streaming_chat_sends_the_engines_deltas_then_finish_and_usage(
    stack: VllmStack, engine: VllmEngine, prompt_tokens: int
) -> None:
    stream = await stack.client.chat.completions.create(
        model=SERVED_NAME,
        messages=MESSAGES,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.0,
        extra_body=IGNORE_EOS,
    )
    chunks = [chunk async for chunk in stream]
    direct = await on_engine(engine, max_tokens=24)

    with_choice = [c for c in chunks if c.choices]
    deltas = [c.choices[0].delta.content or "" for c in with_choice]
    assert with_choice[0].choices[0].delta.role == "assistant"
    assert len([d for d in deltas if d]) > 1  # streamed, not sent in one piece
    assert "".join(deltas) == "".join(o.text for o in direct)
    assert [c.choices[0].finish_reason for c in with_choice][-1] == "length"
    assert {c.id for c in chunks} == {chunks[0].id}
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt_tokens, 24)


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
async def test_a_stop_sequence_ends_the_completion_just_before_it(
    stack: VllmStack, streamed: bool
) -> None:
    free = await stack.client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=48, temperature=0.0, extra_body=IGNORE_EOS
    )
    text = free.choices[0].message.content or ""
    stop = _ascii_pair(text)
    expected = text[: text.index(stop)]

    if streamed:
        stream = await stack.client.chat.completions.create(
            model=SERVED_NAME,
            messages=MESSAGES,
            max_tokens=48,
            stop=[stop],
            stream=True,
            temperature=0.0,
            extra_body=IGNORE_EOS,
        )
        chunks = [c async for c in stream if c.choices]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        done = await stack.client.chat.completions.create(
            model=SERVED_NAME,
            messages=MESSAGES,
            max_tokens=48,
            stop=[stop],
            temperature=0.0,
            extra_body=IGNORE_EOS,
        )
        content = done.choices[0].message.content or ""
        finish = done.choices[0].finish_reason

    assert content == expected
    assert finish == "stop"


def _ascii_pair(text: str) -> str:
    """Two printable ASCII characters from past the start of ``text``: a stop string it holds."""
    for i in range(2, len(text) - 1):
        pair = text[i : i + 2]
        if pair.isascii() and pair.isprintable() and not pair.isspace():
            return pair
    raise AssertionError(f"no printable ASCII pair in {text!r}")


async def test_the_same_seed_gives_the_same_tokens_and_another_seed_other_tokens(
    stack: VllmStack,
) -> None:
    async def sample(seed: int) -> list[str]:
        done = await stack.client.chat.completions.create(
            model=SERVED_NAME,
            messages=MESSAGES,
            max_tokens=24,
            temperature=1.0,
            seed=seed,
            logprobs=True,
            extra_body={"ignore_eos": True},
        )
        logprobs = done.choices[0].logprobs
        assert logprobs is not None
        assert logprobs.content is not None
        return [entry.token for entry in logprobs.content]

    first = await sample(1234)
    again = await sample(1234)
    other = await sample(4321)

    assert len(first) == 24
    assert again == first
    assert other != first


async def test_a_client_that_disconnects_mid_stream_leaves_the_engine_within_a_few_steps(
    stack: VllmStack, engine: VllmEngine
) -> None:
    stream = await stack.client.chat.completions.create(
        model=SERVED_NAME,
        messages=MESSAGES,
        max_tokens=200,
        stream=True,
        temperature=0.0,
        extra_body=IGNORE_EOS,
    )
    seen = 0
    request_id = ""
    async for chunk in stream:
        request_id = chunk.id
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen == 3:
            break
    assert request_id in engine.in_flight()
    assert engine.load().running == 1

    steps = StepCounter(engine)
    await stream.close()  # drops the connection mid-stream
    await eventually(
        lambda: engine.load().running == 0 and request_id not in engine.in_flight(),
        interval_s=0.001,
    )

    assert steps.stop() <= MAX_STEPS_TO_ABORT_THROUGH_THE_STACK, steps.after


@pytest.mark.parametrize(
    ("kwargs", "error", "param", "says"),
    [
        (
            {"messages": [{"role": "user", "content": LONG_PROMPT}]},
            openai.BadRequestError,
            "messages",
            "maximum context length is 256 tokens",
        ),
        (
            {"messages": [{"role": "user", "content": LONG_PROMPT}], "stream": True},
            openai.BadRequestError,
            "messages",
            "maximum context length is 256 tokens",
        ),
        ({"max_tokens": 250}, openai.BadRequestError, "max_tokens", "leaving room for"),
        ({"model": "no-such-model"}, openai.NotFoundError, "model", "no-such-model"),
        ({"temperature": 2.5}, openai.BadRequestError, "temperature", "temperature"),
        ({"top_p": 0.0}, openai.BadRequestError, "top_p", "top_p must be in (0.0, 1.0]"),
        ({"presence_penalty": -3}, openai.BadRequestError, "presence_penalty", "presence"),
        ({"stop": ["a", "b", "c", "d", "e"]}, openai.BadRequestError, "stop", "stop"),
    ],
    ids=[
        "prompt-over-context",
        "prompt-over-context-streamed",
        "max-tokens-over-room",
        "unknown-model",
        "temperature",
        "top-p-zero",
        "presence-penalty",
        "five-stops",
    ],
)
async def test_bad_input_is_an_openai_error_naming_the_problem_and_the_worker_keeps_serving(
    stack: VllmStack,
    kwargs: dict[str, Any],
    error: type[openai.APIStatusError],
    param: str,
    says: str,
) -> None:
    request: dict[str, Any] = {"model": SERVED_NAME, "messages": MESSAGES, **kwargs}

    with pytest.raises(error) as raised:
        await stack.client.chat.completions.create(**request)

    body = raised.value.body
    assert isinstance(body, dict)
    assert body["param"] == param
    assert body["type"] == "invalid_request_error"
    assert says in body["message"]
    after = await stack.client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=2
    )
    assert after.usage is not None
    assert after.usage.completion_tokens >= 1
    # The client has its answer a moment before the worker's handler has wound down.
    await eventually(lambda: stack.worker.service.inflight == 0)


@pytest.mark.parametrize(
    ("sampling", "content", "param", "code"),
    [
        ({"max_tokens": 250}, "Hello", "max_tokens", None),
        ({}, LONG_PROMPT, "messages", "context_length_exceeded"),
        ({"top_p": 0.0}, "Hello", "top_p", None),
    ],
    ids=["max-tokens", "context", "top-p"],
)
async def test_the_worker_refuses_bad_input_with_invalid_argument_and_details(
    stack: VllmStack, sampling: dict[str, Any], content: str, param: str, code: str | None
) -> None:
    request = worker_pb2.GenerateRequest(
        request_id=f"grpc-{uuid.uuid4().hex}",
        model=SERVED_NAME,
        sampling=worker_pb2.SamplingParams(**sampling),
    )
    request.messages.add(role="user", content=content)
    async with insecure_channel(stack.worker.address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).Generate(request)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()

    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert param in (raised.value.details() or "")
    trailers = dict(raised.value.trailing_metadata() or ())
    assert trailers.get(PARAM_KEY) == param
    assert trailers.get(CODE_KEY) == code
