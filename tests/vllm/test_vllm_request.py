"""Request checks that run before the engine sees a request: ranges, and the context budget."""

from __future__ import annotations

import math

import pytest

from services.common.errors import ContextLengthExceeded, InvalidRequest
from services.worker.engine import ChatTurn, SamplingOptions
from services.worker.vllm.request import check_messages, check_sampling, completion_budget


@pytest.mark.parametrize(
    "options",
    [
        SamplingOptions(),
        SamplingOptions(temperature=0.0, top_p=1.0),
        SamplingOptions(temperature=2.0, top_p=1e-6),
        SamplingOptions(presence_penalty=-2.0, frequency_penalty=2.0),
        SamplingOptions(max_tokens=1, stop=("a", "b", "c", "d")),
        SamplingOptions(seed=-(2**63)),
        SamplingOptions(seed=2**63 - 1),
        SamplingOptions(logprobs=True, top_logprobs=0),
        SamplingOptions(logprobs=True, top_logprobs=20),
    ],
)
def test_values_at_the_edges_of_their_ranges_are_accepted(options: SamplingOptions) -> None:
    check_sampling(options)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        (SamplingOptions(temperature=-0.1), "temperature"),
        (SamplingOptions(temperature=2.01), "temperature"),
        (SamplingOptions(temperature=math.nan), "temperature"),
        (SamplingOptions(top_p=0.0), "top_p"),
        (SamplingOptions(top_p=1.5), "top_p"),
        (SamplingOptions(top_p=math.inf), "top_p"),
        (SamplingOptions(max_tokens=0), "max_tokens"),
        (SamplingOptions(presence_penalty=-2.1), "presence_penalty"),
        (SamplingOptions(frequency_penalty=math.nan), "frequency_penalty"),
        (SamplingOptions(stop=("a", "b", "c", "d", "e")), "stop"),
        (SamplingOptions(stop=("ok", "")), "stop"),
        (SamplingOptions(seed=2**63), "seed"),
        (SamplingOptions(seed=-(2**63) - 1), "seed"),
        (SamplingOptions(logprobs=True, top_logprobs=21), "top_logprobs"),
        (SamplingOptions(logprobs=True, top_logprobs=-1), "top_logprobs"),
        (SamplingOptions(logprobs=False, top_logprobs=1), "top_logprobs"),
    ],
)
def test_out_of_range_values_name_their_param(options: SamplingOptions, param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        check_sampling(options)

    assert raised.value.param == param


@pytest.mark.parametrize(
    "messages",
    [(), (ChatTurn(role="user", content="hi"), ChatTurn(role="wizard", content="boo"))],
)
def test_no_messages_or_an_unknown_role_is_a_messages_error(
    messages: tuple[ChatTurn, ...],
) -> None:
    with pytest.raises(InvalidRequest) as raised:
        check_messages(messages)

    assert raised.value.param == "messages"


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "budget"),
    [
        (10, None, 246),
        (10, 246, 246),
        (10, 1, 1),
        (255, None, 1),
        (255, 1, 1),
    ],
)
def test_the_budget_is_max_tokens_or_the_rest_of_the_context(
    prompt: int, max_tokens: int | None, budget: int
) -> None:
    assert (
        completion_budget(prompt_tokens=prompt, max_model_len=256, max_tokens=max_tokens) == budget
    )


@pytest.mark.parametrize(("prompt", "max_tokens"), [(256, None), (256, 1), (300, 10)])
def test_a_prompt_that_fills_the_context_is_context_length_exceeded(
    prompt: int, max_tokens: int | None
) -> None:
    with pytest.raises(ContextLengthExceeded) as raised:
        completion_budget(prompt_tokens=prompt, max_model_len=256, max_tokens=max_tokens)

    assert raised.value.param == "messages"
    assert raised.value.code == "context_length_exceeded"


def test_max_tokens_that_does_not_fit_beside_the_prompt_is_a_max_tokens_error() -> None:
    with pytest.raises(InvalidRequest) as raised:
        completion_budget(prompt_tokens=10, max_model_len=256, max_tokens=247)

    assert type(raised.value) is InvalidRequest
    assert raised.value.param == "max_tokens"
    assert "246" in raised.value.message
