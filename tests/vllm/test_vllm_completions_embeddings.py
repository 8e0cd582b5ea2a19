"""Completions (raw prompts, echo with prompt logprobs) on the real vLLM engine, and
embeddings from a tiny pooling model built the same way as the tiny chat model (the same
random Llama, declared Matryoshka, served with ``--runner pooling``)."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

import pytest
import pytest_asyncio
from transformers import AutoTokenizer

from services.common.errors import InvalidRequest
from services.worker.engine import (
    EmbedRequest,
    EngineOutput,
    EngineRequest,
    RawPrompt,
    SamplingOptions,
)
from services.worker.vllm.config import VllmConfig
from services.worker.vllm.engine import VllmEngine
from services.worker.vllm.tinymodel import TinyModelSpec, build_tiny_model
from tests.vllm.conftest import SERVED_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

EMBED_NAME = "tiny-embed"


@pytest.fixture(scope="session")
def tiny_embed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-embed", TinyModelSpec(matryoshka=True)
    )


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def pooling(tiny_embed_dir: Path) -> AsyncIterator[VllmEngine]:
    eng = VllmEngine(
        VllmConfig.cpu_test(tiny_embed_dir, served_model_name=EMBED_NAME, runner="pooling")
    )
    await eng.start()
    yield eng
    await eng.shutdown()


def completion(prompt: RawPrompt, *, echo: bool = False, **sampling: object) -> EngineRequest:
    return EngineRequest(
        request_id=f"test-{uuid.uuid4().hex}",
        model=SERVED_NAME,
        messages=(),
        prompt=prompt,
        echo=echo,
        sampling=SamplingOptions(**sampling),  # type: ignore[arg-type]
    )


async def run(engine: VllmEngine, request: EngineRequest) -> list[EngineOutput]:
    async with aclosing(engine.generate(request)) as stream:
        return [out async for out in stream]


async def test_a_token_id_prompt_is_completed_without_a_chat_template(
    engine: VllmEngine,
) -> None:
    ids = [5, 17, 42, 99, 7]
    outs = await run(
        engine, completion(RawPrompt(token_ids=tuple(ids)), max_tokens=4, temperature=0)
    )
    assert outs[-1].prompt_tokens == len(ids)  # exactly the ids given: no template, no BOS
    assert outs[-1].completion_tokens == 4
    assert outs[-1].finish_reason is not None


async def test_a_text_prompt_with_echo_returns_it_and_its_logprobs(
    engine: VllmEngine, tiny_model_dir: Path
) -> None:
    text = "the edge and the router"
    request = completion(
        RawPrompt(text=text), echo=True, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    )
    outs = await run(engine, request)
    first = outs[0]
    assert first.prompt_text == text
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = tokenizer.encode(text)
    assert outs[-1].prompt_tokens == len(expected)
    lps = first.prompt_logprobs
    assert len(lps) == len(expected)
    assert lps[0].logprob == 0.0  # the first token has none
    assert all(lp.logprob <= 0 for lp in lps[1:])
    assert all(len(lp.top) <= 2 for lp in lps)
    assert sum(len(o.logprobs) for o in outs) == 3


async def test_token_ids_outside_the_vocabulary_are_refused_naming_the_prompt(
    engine: VllmEngine,
) -> None:
    with pytest.raises(InvalidRequest) as err:
        await run(engine, completion(RawPrompt(token_ids=(1, 10**6)), max_tokens=2))
    assert err.value.param == "prompt"


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        ({"logit_bias": ((10**6, 5.0),)}, "logit_bias"),
        ({"stop_token_ids": (3, 10**6)}, "stop_token_ids"),
    ],
)
async def test_sampling_token_ids_outside_the_vocabulary_are_refused_naming_them(
    engine: VllmEngine, sampling: dict[str, object], param: str
) -> None:
    """The edge cannot know a model's vocabulary: the worker checks, before vLLM fails the
    request as an engine error."""
    request = completion(RawPrompt(token_ids=(1, 2)), max_tokens=2, **sampling)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as err:
        await run(engine, request)
    assert err.value.param == param
    assert "outside this model's vocabulary" in err.value.message


async def test_min_tokens_beyond_the_context_s_room_is_refused_naming_it(
    engine: VllmEngine,
) -> None:
    with pytest.raises(InvalidRequest) as err:
        await run(engine, completion(RawPrompt(token_ids=(1, 2)), min_tokens=100_000))
    assert err.value.param == "min_tokens"


async def test_the_pooling_model_reports_embeddings_only(pooling: VllmEngine) -> None:
    (model,) = pooling.models()
    caps = model.capabilities
    assert (caps.embeddings, caps.chat, caps.completions) == (True, False, False)
    assert caps.embedding_dimensions == 128
    assert caps.dimensions_configurable is True


async def test_embeddings_are_unit_vectors_and_equal_for_equal_inputs(
    pooling: VllmEngine,
) -> None:
    request = EmbedRequest(
        request_id=f"e-{uuid.uuid4().hex}",
        model=EMBED_NAME,
        inputs=(
            RawPrompt(text="hello edge"),
            RawPrompt(text="hello edge"),
            RawPrompt(token_ids=(3, 4, 5)),
        ),
    )
    result = await pooling.embed(request)
    a, b, c = result.vectors
    assert len(a) == 128
    assert math.sqrt(sum(x * x for x in a)) == pytest.approx(1.0, abs=1e-5)
    assert a == pytest.approx(b, abs=1e-6)
    assert a != pytest.approx(c, abs=1e-3)
    assert result.prompt_tokens[2] == 3


async def test_dimensions_truncate_on_a_matryoshka_model(pooling: VllmEngine) -> None:
    request = EmbedRequest(
        request_id=f"e-{uuid.uuid4().hex}",
        model=EMBED_NAME,
        inputs=(RawPrompt(text="short please"),),
        dimensions=32,
    )
    (v,) = (await pooling.embed(request)).vectors
    assert len(v) == 32
    assert math.sqrt(sum(x * x for x in v)) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(InvalidRequest) as err:
        await pooling.embed(
            EmbedRequest(
                request_id="e-too-big", model=EMBED_NAME, inputs=request.inputs, dimensions=129
            )
        )
    assert err.value.param == "dimensions"


async def test_each_runner_refuses_the_other_ones_work(
    engine: VllmEngine, pooling: VllmEngine
) -> None:
    with pytest.raises(InvalidRequest) as embed_err:
        await engine.embed(
            EmbedRequest(request_id="e-chat", model=SERVED_NAME, inputs=(RawPrompt(text="x"),))
        )
    assert embed_err.value.param == "input"
    request = EngineRequest(
        request_id="g-pool", model=EMBED_NAME, messages=(), prompt=RawPrompt(text="x")
    )
    with pytest.raises(InvalidRequest) as gen_err:
        await run(pooling, request)
    assert gen_err.value.param == "prompt"
