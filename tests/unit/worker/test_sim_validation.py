"""Every request the simulator refuses is refused before anything is queued, with the error
class and the parameter a client needs to fix it."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    MeridianError,
    ModelNotFound,
)
from services.worker.engine import ChatTurn, EngineRequest, SamplingOptions
from services.worker.sim.config import SimConfig
from services.worker.sim.scheduler import SimScheduler

CONFIG = SimConfig(models=("meridian-sim", "alias"), max_model_len=128, kv_cache_tokens=1024)
HELLO = (ChatTurn(role="user", content="hello"),)
LONG = (ChatTurn(role="user", content=" ".join(["word"] * 200)),)


def request(
    *,
    model: str = "meridian-sim",
    messages: tuple[ChatTurn, ...] = HELLO,
    request_id: str = "r1",
    **sampling: Any,
) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        model=model,
        messages=messages,
        sampling=SamplingOptions(**sampling),
    )


@pytest.mark.parametrize(
    ("bad", "error", "param"),
    [
        (request(model="gpt-9"), ModelNotFound, "model"),
        (request(request_id=""), InvalidRequest, "request_id"),
        (request(messages=()), InvalidRequest, "messages"),
        (request(messages=(ChatTurn(role="robot", content="hi"),)), InvalidRequest, "messages"),
        (request(temperature=-0.1), InvalidRequest, "temperature"),
        (request(temperature=2.01), InvalidRequest, "temperature"),
        (request(temperature=float("nan")), InvalidRequest, "temperature"),
        (request(top_p=0.0), InvalidRequest, "top_p"),
        (request(top_p=1.5), InvalidRequest, "top_p"),
        (request(max_tokens=0), InvalidRequest, "max_tokens"),
        (request(presence_penalty=2.5), InvalidRequest, "presence_penalty"),
        (request(frequency_penalty=-3.0), InvalidRequest, "frequency_penalty"),
        (request(logprobs=True, top_logprobs=21), InvalidRequest, "top_logprobs"),
        (request(top_logprobs=2), InvalidRequest, "top_logprobs"),
        (request(stop=("ok", "")), InvalidRequest, "stop"),
        (request(messages=LONG), ContextLengthExceeded, "messages"),
        (request(max_tokens=123), ContextLengthExceeded, "max_tokens"),
    ],
)
def test_bad_requests_name_their_param(
    bad: EngineRequest, error: type[MeridianError], param: str
) -> None:
    s = SimScheduler(CONFIG)
    with pytest.raises(error) as info:
        s.add(bad, 0.0)
    assert type(info.value) is error
    assert info.value.param == param
    assert (s.num_waiting, s.num_running) == (0, 0)
    with pytest.raises(error):
        s.check(bad)


def test_context_errors_are_invalid_requests_with_the_context_code() -> None:
    s = SimScheduler(CONFIG)
    with pytest.raises(InvalidRequest) as info:
        s.add(request(max_tokens=125), 0.0)
    assert info.value.code == "context_length_exceeded"
    assert "128" in info.value.message


@pytest.mark.parametrize(
    "good",
    [
        request(),
        request(model="alias"),
        request(temperature=0.0, top_p=1.0, max_tokens=1),
        request(temperature=2.0, presence_penalty=-2.0, frequency_penalty=2.0),
        request(logprobs=True, top_logprobs=20, stop=("\n",), seed=-5),
        request(max_tokens=128 - 6),  # the prompt is 6 tokens: exactly the context
    ],
)
def test_boundary_values_are_accepted(good: EngineRequest) -> None:
    SimScheduler(CONFIG).add(good, 0.0)


def test_min_tokens_beyond_what_the_context_leaves_is_refused_naming_it() -> None:
    """Without max_tokens the budget is what the context leaves (128 - 6 here): a min_tokens
    above it ran to the end of the context and stopped short anyway."""
    with pytest.raises(InvalidRequest) as info:
        SimScheduler(CONFIG).add(request(min_tokens=1000), 0.0)
    assert info.value.param == "min_tokens"
    SimScheduler(CONFIG).add(request(min_tokens=128 - 6), 0.0)
