"""The real vLLM engine (CPU build) behind Meridian's Engine seam, on a tiny random Llama.

The model's text is noise, so tests compare the engine with itself and with the model's own
tokenizer: what is checked is the serving path (chat template, counts, sampling, streaming,
cancellation, load), not the words.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from transformers import AutoTokenizer
from vllm.v1.metrics.loggers import LoggingStatLogger, PrometheusStatLogger

from services.common.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    MeridianError,
    ModelNotFound,
)
from services.worker.engine import (
    ChatTurn,
    EngineOutput,
    EngineRequest,
    FinishReason,
    ModelState,
    SamplingOptions,
)
from services.worker.vllm.engine import VllmEngine
from services.worker.vllm.stats import NoEngineMetrics
from tests.vllm.conftest import SERVED_NAME
from tests.vllm.steps import MAX_STEPS_TO_ABORT, StepCounter

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

PROMPT = "Tell me a story about the edge."


def chat(
    content: str = PROMPT,
    *,
    model: str = SERVED_NAME,
    messages: tuple[ChatTurn, ...] | None = None,
    **sampling: Any,
) -> EngineRequest:
    return EngineRequest(
        request_id=f"test-{uuid.uuid4().hex}",
        model=model,
        messages=messages if messages is not None else (ChatTurn(role="user", content=content),),
        sampling=SamplingOptions(**sampling),
    )


async def run(engine: VllmEngine, request: EngineRequest) -> list[EngineOutput]:
    async with aclosing(engine.generate(request)) as stream:
        return [output async for output in stream]


def token_ids(outputs: list[EngineOutput]) -> list[int]:
    return [t for output in outputs for t in output.token_ids]


async def wait_until(condition: Callable[[], bool], *, timeout_s: float = 10.0) -> float:
    """Poll ``condition`` every millisecond; return the seconds it took to hold."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.001)
    return time.monotonic() - start


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


async def test_models_report_ready_after_start(engine: VllmEngine) -> None:
    (model,) = engine.models()
    assert (model.name, model.state, model.max_model_len, model.engine) == (
        SERVED_NAME,
        ModelState.READY,
        256,
        "vllm",
    )
    caps = model.capabilities
    assert (caps.chat, caps.completions, caps.echo, caps.embeddings) == (True, True, True, False)
    assert caps.max_context_len == 256
    assert not caps.tools  # no --tool-call-parser
    assert caps.structured_outputs
    assert caps.max_n == 16
    assert engine.failure is None


async def test_vllms_own_prometheus_logger_is_off_by_default_and_stats_stay_on(
    engine: VllmEngine,
) -> None:
    # Without --engine-metrics, vLLM keeps no Prometheus series (their cost per engine step
    # bought nothing: the worker's /metrics never showed them) and no throughput log line
    # (written only on do_log_stats, which the worker never calls); the stats the load
    # report and the timings need still flow (the timings and load tests below).
    llm = engine._llm
    assert llm is not None
    assert llm.log_stats
    kinds = []
    for logger in llm.logger_manager.stat_loggers:  # per-engine loggers sit in adapters
        inner = getattr(logger, "per_engine_stat_loggers", {0: logger})
        kinds += [type(each) for each in inner.values()]
    assert NoEngineMetrics in kinds
    assert PrometheusStatLogger not in kinds
    assert LoggingStatLogger not in kinds
    assert not any(name.startswith("vllm:") for name in REGISTRY._names_to_collectors)


async def test_streamed_deltas_assemble_into_the_full_text(
    engine: VllmEngine, tokenizer: Any
) -> None:
    outputs = await run(engine, chat(temperature=0.0, max_tokens=32, ignore_eos=True))

    streamed = "".join(output.text for output in outputs)
    decoded = tokenizer.decode(token_ids(outputs), skip_special_tokens=True)
    assert len(outputs) > 1
    assert len(streamed) > 10
    # The incremental detokenizer holds back the bytes of an unfinished UTF-8 character; a
    # stream that ends inside one (this random model emits arbitrary bytes) never sends them,
    # where a one-shot decode renders them as U+FFFD. Everything else must match exactly.
    assert decoded.startswith(streamed)
    assert set(decoded[len(streamed) :]) <= {"\ufffd"}


async def test_usage_counts_are_the_engines_own(engine: VllmEngine, tokenizer: Any) -> None:
    messages = (
        ChatTurn(role="system", content="You are terse."),
        ChatTurn(role="user", content="Count to three."),
    )
    outputs = await run(engine, chat(messages=messages, max_tokens=9, ignore_eos=True))

    rendered = tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages],
        tokenize=True,
        add_generation_prompt=True,
    )["input_ids"]
    assert {output.prompt_tokens for output in outputs} == {len(rendered)}
    assert [output.completion_tokens for output in outputs] == list(range(1, 10))
    assert outputs[-1].completion_tokens == len(token_ids(outputs))


async def test_max_tokens_ends_with_length_after_exactly_that_many_tokens(
    engine: VllmEngine,
) -> None:
    outputs = await run(engine, chat(max_tokens=7, ignore_eos=True))

    assert len(token_ids(outputs)) == 7
    assert outputs[-1].completion_tokens == 7
    assert [output.finish_reason for output in outputs] == [None] * (len(outputs) - 1) + [
        FinishReason.LENGTH
    ]


async def test_no_max_tokens_generates_up_to_the_end_of_the_context(engine: VllmEngine) -> None:
    outputs = await run(engine, chat(ignore_eos=True))

    assert outputs[-1].finish_reason is FinishReason.LENGTH
    assert outputs[-1].prompt_tokens + outputs[-1].completion_tokens == 256


async def test_stop_string_ends_the_stream_before_it(engine: VllmEngine) -> None:
    free = await run(engine, chat(temperature=0.0, max_tokens=40, ignore_eos=True))
    text = "".join(output.text for output in free)
    # A stop string taken from the greedy text itself: the same greedy run must end just
    # before its first occurrence (the stop string is not returned, as in OpenAI's API).
    stop = next(
        text[i : i + 2]
        for i in range(3, len(text) - 1)
        if text[i : i + 2].isprintable() and "\ufffd" not in text[i : i + 2]
    )
    stopped = await run(engine, chat(temperature=0.0, max_tokens=40, ignore_eos=True, stop=(stop,)))

    assert "".join(output.text for output in stopped) == text[: text.index(stop)]
    assert stopped[-1].finish_reason is FinishReason.STOP
    assert stopped[-1].completion_tokens < 40


async def test_same_seed_gives_the_same_tokens(engine: VllmEngine) -> None:
    sampled = [
        token_ids(
            await run(engine, chat(temperature=1.0, seed=seed, max_tokens=16, ignore_eos=True))
        )
        for seed in (1234, 1234, 99, -(2**63), -(2**63))
    ]

    assert sampled[0] == sampled[1]
    assert sampled[0] != sampled[2]
    assert sampled[3] == sampled[4]  # the whole int64 range is a valid seed


async def test_logprobs_list_the_chosen_token_and_the_top_alternatives(
    engine: VllmEngine,
) -> None:
    outputs = await run(
        engine, chat(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=True, top_logprobs=3)
    )

    entries = [entry for output in outputs for entry in output.logprobs]
    assert len(entries) == 6
    for entry in entries:
        assert len(entry.top) == 3
        assert [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)
        # Greedy decoding picks the most likely token.
        assert entry.logprob == pytest.approx(entry.top[0][1])
        assert entry.logprob <= 0.0


async def test_timings_come_on_the_first_and_the_last_output(engine: VllmEngine) -> None:
    outputs = await run(engine, chat(max_tokens=5, ignore_eos=True))

    first, middle, last = outputs[0], outputs[1:-1], outputs[-1]
    assert first.queue_ms is not None
    assert first.queue_ms >= 0
    assert first.prefill_ms is not None
    assert first.prefill_ms > 0
    assert first.decode_ms is None
    assert all(o.queue_ms is None and o.prefill_ms is None for o in middle)
    assert last.decode_ms is not None
    assert last.decode_ms > 0
    assert last.prefill_ms == first.prefill_ms


async def test_a_repeated_prompt_is_served_from_the_prefix_cache(engine: VllmEngine) -> None:
    # The CPU backend's KV blocks hold 128 tokens: only a prompt past that can hit the cache.
    long_prompt = "the quick brown fox jumps over the lazy dog " * 16
    first = await run(engine, chat(long_prompt, max_tokens=2))
    second = await run(engine, chat(long_prompt, max_tokens=2))

    assert first[-1].prompt_tokens > 128
    assert second[-1].cached_prompt_tokens >= 128
    assert engine.load().prefix_cache_hit_rate > 0.0


@pytest.mark.parametrize(
    ("request_", "error", "param"),
    [
        (chat(model="no-such-model"), ModelNotFound, "model"),
        (chat(messages=()), InvalidRequest, "messages"),
        (chat(messages=(ChatTurn(role="robot", content="hi"),)), InvalidRequest, "messages"),
        (chat(PROMPT + " word" * 300), ContextLengthExceeded, "messages"),
        (chat(max_tokens=250), InvalidRequest, "max_tokens"),
        (chat(max_tokens=0), InvalidRequest, "max_tokens"),
        (chat(temperature=2.5), InvalidRequest, "temperature"),
        (chat(top_p=0.0), InvalidRequest, "top_p"),
        (chat(presence_penalty=2.5), InvalidRequest, "presence_penalty"),
        (chat(frequency_penalty=-2.5), InvalidRequest, "frequency_penalty"),
        (chat(stop=("a", "b", "c", "d", "e")), InvalidRequest, "stop"),
        (chat(stop=("",)), InvalidRequest, "stop"),
        (chat(seed=2**63), InvalidRequest, "seed"),
        (chat(logprobs=True, top_logprobs=21), InvalidRequest, "top_logprobs"),
        (chat(top_logprobs=2), InvalidRequest, "top_logprobs"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
async def test_invalid_requests_fail_before_the_first_output_naming_the_param(
    engine: VllmEngine, request_: EngineRequest, error: type[MeridianError], param: str
) -> None:
    stream = engine.generate(request_)

    with pytest.raises(MeridianError) as raised:
        await anext(stream)

    assert type(raised.value) is error
    assert raised.value.param == param


async def test_truncation_drops_the_oldest_turns_the_models_template_counts(
    engine: VllmEngine,
) -> None:
    """truncate_oldest with the model's own chat template and tokenizer: a conversation past
    the context loses its oldest turns (the system message stays), as few as make the prompt
    fit beside max_tokens, and the first output says how many went."""
    talk = (
        ChatTurn(role="system", content="Be brief."),
        ChatTurn(role="user", content=PROMPT + " word" * 300),
        ChatTurn(role="assistant", content="Once upon a time."),
        ChatTurn(role="user", content=PROMPT),
    )
    with pytest.raises(ContextLengthExceeded):
        await run(engine, chat(messages=talk, max_tokens=4))
    truncated = dataclasses.replace(
        chat(messages=talk, max_tokens=4, ignore_eos=True), truncate_oldest=True
    )
    outputs = await run(engine, truncated)
    assert outputs[0].dropped_messages == 2
    assert 0 < outputs[-1].prompt_tokens <= 256 - 4
    assert outputs[-1].completion_tokens == 4


async def test_cancelling_the_consumer_aborts_in_the_engine_within_a_few_steps(
    engine: VllmEngine,
) -> None:
    """Counted in the engine core's steps, not milliseconds: ~8 ms and 2 steps on a quiet
    box, but 111 ms once in CI on a loaded one (the core and this process share 2 cores). A
    consumer whose cancellation did not abort would run its ~200 remaining steps."""
    started = [asyncio.Event() for _ in range(4)]

    async def consume(first: asyncio.Event) -> None:
        async with aclosing(engine.generate(chat(ignore_eos=True))) as stream:
            async for _ in stream:
                first.set()

    tasks = [asyncio.create_task(consume(event)) for event in started]
    await asyncio.gather(*(event.wait() for event in started))
    assert engine.load().running == 4

    steps = StepCounter(engine)
    for task in tasks:
        task.cancel()
    await wait_until(lambda: engine.load().running == 0)
    steps.stop()

    assert steps.after <= MAX_STEPS_TO_ABORT
    assert all(task.cancelled() for task in tasks)


async def test_closing_the_stream_early_aborts_in_the_engine_within_a_few_steps(
    engine: VllmEngine,
) -> None:
    async with aclosing(engine.generate(chat(ignore_eos=True))) as stream:
        await anext(stream)
        assert engine.load().running == 1
        steps = StepCounter(engine)
    # Leaving the block closed the stream at its yield.
    await wait_until(lambda: engine.load().running == 0)

    assert steps.stop() <= MAX_STEPS_TO_ABORT, steps.after


async def test_explicit_abort_ends_the_stream_with_abort(engine: VllmEngine) -> None:
    request = chat(ignore_eos=True)
    outputs: list[EngineOutput] = []
    async with aclosing(engine.generate(request)) as stream:
        async for output in stream:
            outputs.append(output)
            if len(outputs) == 2:
                await engine.abort(request.request_id)

    assert outputs[-1].finish_reason is FinishReason.ABORT
    assert outputs[-1].completion_tokens < 256 - outputs[-1].prompt_tokens
    await wait_until(lambda: engine.load().running == 0)


async def test_load_counts_the_requests_in_flight(engine: VllmEngine) -> None:
    started = [asyncio.Event() for _ in range(5)]

    async def consume(first: asyncio.Event) -> list[EngineOutput]:
        outputs = []
        async with aclosing(engine.generate(chat(max_tokens=150, ignore_eos=True))) as stream:
            async for output in stream:
                outputs.append(output)
                first.set()
        return outputs

    tasks = [asyncio.create_task(consume(event)) for event in started]
    await asyncio.gather(*(event.wait() for event in started))
    busy = engine.load()
    results = await asyncio.gather(*tasks)
    idle = engine.load()

    assert busy.running == 5
    assert busy.waiting == 0
    assert busy.max_running == 16
    assert 0.0 < busy.kv_cache_usage < 1.0
    assert all(r[-1].finish_reason is FinishReason.LENGTH for r in results)
    assert idle.running == 0
    assert idle.tokens_per_second > 0.0
