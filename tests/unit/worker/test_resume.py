"""A continued stream on the worker: the resume state is validated like every other field,
SimEngine continues byte-identically (text, ids, logprobs, usage), and ContinuedText sends the
held-back text first and stops on a stop string that straddles the boundary."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from meridian.v1 import worker_pb2
from services.common.errors import InvalidRequest
from services.worker import convert
from services.worker.engine import (
    ChatTurn,
    EngineOutput,
    EngineRequest,
    FinishReason,
    ResumeInput,
    SamplingOptions,
)
from services.worker.resume_text import ContinuedText
from services.worker.sim.config import SimConfig
from services.worker.sim.engine import SimEngine


def pb_request(**resume: Any) -> worker_pb2.GenerateRequest:
    req = worker_pb2.GenerateRequest(request_id="r.m1", model="m")
    req.messages.add(role="user", content="hi")
    req.sampling.max_tokens = 10
    if resume:
        for key, value in resume.items():
            if key == "delivered_token_ids":
                req.resume.delivered_token_ids.extend(value)
            else:
                setattr(req.resume, key, value)
    return req


def test_no_resume_field_means_a_fresh_request() -> None:
    assert convert.request_from_pb(pb_request()).resume is None


def test_a_valid_resume_state_reaches_the_engine() -> None:
    r = convert.request_from_pb(
        pb_request(
            delivered_token_ids=[5, 6],
            delivered_text_chars=4,
            delivered_text_tail="ab",
            origin_request_id="r",
            migrations=1,
        )
    )
    assert r.resume == ResumeInput(
        delivered_token_ids=(5, 6),
        delivered_text_chars=4,
        delivered_text_tail="ab",
        origin_request_id="r",
        migrations=1,
    )
    assert r.seed_id == "r"


@pytest.mark.parametrize(
    ("resume", "param"),
    [
        ({"delivered_text_chars": 3}, "resume.delivered_token_ids"),
        ({"delivered_token_ids": list(range(10))}, "resume.delivered_token_ids"),
        (
            {"delivered_token_ids": [1], "delivered_text_chars": 1, "delivered_text_tail": "ab"},
            "resume.delivered_text_tail",
        ),
        (
            {
                "delivered_token_ids": [1],
                "delivered_text_chars": 999,
                "delivered_text_tail": "x" * 300,
            },
            "resume.delivered_text_tail",
        ),
        ({"delivered_token_ids": [1], "origin_request_id": "o" * 200}, "resume.origin_request_id"),
    ],
)
def test_a_bad_resume_state_is_refused_naming_the_field(resume: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.request_from_pb(pb_request(**resume))
    assert err.value.param == param


@pytest.fixture
async def engine() -> AsyncIterator[SimEngine]:
    e = SimEngine(SimConfig(time_scale=0.01, load_delay_s=0.0))
    await e.start()
    yield e
    await e.shutdown()


def request(request_id: str, resume: ResumeInput | None = None, **sampling: Any) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        model="meridian-sim",
        messages=(ChatTurn(role="user", content="tell me a story"),),
        sampling=SamplingOptions(**{"max_tokens": 60, "ignore_eos": True, **sampling}),
        resume=resume,
    )


async def run(e: SimEngine, r: EngineRequest) -> list[EngineOutput]:
    async with contextlib.aclosing(e.generate(r)) as outputs:
        return [o async for o in outputs]


def delivered(outputs: list[EngineOutput], k: int, origin: str) -> ResumeInput:
    text = "".join(o.text for o in outputs[:k])
    return ResumeInput(
        delivered_token_ids=tuple(t for o in outputs[:k] for t in o.token_ids),
        delivered_text_chars=len(text),
        delivered_text_tail=text[-256:],
        origin_request_id=origin,
    )


@pytest.mark.parametrize("sampling", [{}, {"seed": 3}, {"temperature": 0.0}])
async def test_sim_continues_a_migrated_stream_byte_identically(
    engine: SimEngine, sampling: dict[str, Any]
) -> None:
    full = await run(engine, request("a", logprobs=True, top_logprobs=2, **sampling))
    k = 17
    rest = await run(
        engine,
        request("a.m1", delivered(full, k, "a"), logprobs=True, top_logprobs=2, **sampling),
    )
    assert "".join(o.text for o in full[:k] + rest) == "".join(o.text for o in full)
    assert [t for o in full[:k] + rest for t in o.token_ids] == [
        t for o in full for t in o.token_ids
    ]
    assert [lp for o in full[:k] + rest for lp in o.logprobs] == [
        lp for o in full for lp in o.logprobs
    ]
    assert rest[-1].completion_tokens == full[-1].completion_tokens == 60
    assert rest[-1].prompt_tokens == full[-1].prompt_tokens
    assert rest[-1].finish_reason is FinishReason.LENGTH


def tokens(outputs: list[EngineOutput]) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


@pytest.mark.parametrize(
    ("max_tokens", "min_tokens", "finish", "total"),
    [(500, 500, FinishReason.LENGTH, 500), (500, 450, FinishReason.STOP, 451)],
)
async def test_sim_continues_a_stream_min_tokens_keeps_past_its_natural_end(
    engine: SimEngine, max_tokens: int, min_tokens: int, finish: FinishReason, total: int
) -> None:
    """The natural end (at most 384 tokens here) has passed when the stream moves; min_tokens
    kept it going, and the continuation goes on exactly as the uninterrupted stream did —
    it was refused ("already reach this request's end") as if the stream had ended."""
    sampling: dict[str, Any] = {
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
        "ignore_eos": False,
        "seed": 3,
        "logprobs": True,
        "top_logprobs": 2,
    }
    full = await run(engine, request("m", **sampling))
    assert (full[-1].finish_reason, full[-1].completion_tokens) == (finish, total)
    k = 420
    assert len(tokens(full[:k])) >= k > 384
    rest = await run(engine, request("m.m1", delivered(full, k, "m"), **sampling))
    assert "".join(o.text for o in full[:k] + rest) == "".join(o.text for o in full)
    assert tokens(full[:k] + rest) == tokens(full)
    assert [lp for o in full[:k] + rest for lp in o.logprobs] == [
        lp for o in full for lp in o.logprobs
    ]
    assert (rest[-1].finish_reason, rest[-1].completion_tokens) == (finish, total)
    assert rest[-1].prompt_tokens == full[-1].prompt_tokens


async def test_sim_refuses_to_continue_a_stream_that_had_ended(engine: SimEngine) -> None:
    """Judged by the rules that ended it: all of a stream min_tokens held to 451 tokens is
    refused; all but its last token continues, to the same last token."""
    sampling: dict[str, Any] = {"max_tokens": 500, "min_tokens": 450, "ignore_eos": False}
    full = await run(engine, request("e", seed=4, **sampling))
    assert full[-1].completion_tokens == 451
    with pytest.raises(InvalidRequest) as err:
        await run(engine, request("e.m1", delivered(full, len(full), "e"), seed=4, **sampling))
    assert err.value.param == "resume.delivered_token_ids"
    assert "already reach this request's end" in err.value.message
    rest = await run(
        engine, request("e.m2", delivered(full, len(full) - 1, "e"), seed=4, **sampling)
    )
    assert tokens(rest) == tokens(full[-1:])
    assert (rest[-1].finish_reason, rest[-1].completion_tokens) == (FinishReason.STOP, 451)


async def test_sim_sends_the_text_the_first_worker_held_back_first(engine: SimEngine) -> None:
    plain = await run(engine, request("b", seed=9))
    text = "".join(o.text for o in plain)
    stop = text[40:50]
    assert text.count(stop) == 1
    stopped = await run(engine, request("b", seed=9, stop=(stop,)))
    want = "".join(o.text for o in stopped)
    assert want == text[:40]
    # the client got the text up to 3 characters before the stop string's start; the tokens
    # reach past it (the first worker held the possible stop string back)
    ids = [t for o in plain for t in o.token_ids]
    pieces_len = 0
    k = 0
    while pieces_len < 43:
        pieces_len = len("".join(o.text for o in plain[: k + 1]))
        k += 1
    resume = ResumeInput(
        delivered_token_ids=tuple(ids[:k]),
        delivered_text_chars=37,
        delivered_text_tail=text[:37],
        origin_request_id="b",
    )
    rest = await run(engine, request("b.m1", resume, seed=9, stop=(stop,)))
    assert text[:37] + "".join(o.text for o in rest) == want
    assert rest[-1].finish_reason is FinishReason.STOP


async def test_sim_refuses_token_ids_that_are_not_its_sequence(engine: SimEngine) -> None:
    resume = ResumeInput(delivered_token_ids=(1, 2, 3), delivered_text_chars=0)
    with pytest.raises(InvalidRequest) as err:
        await run(engine, request("c.m1", resume, seed=1))
    assert err.value.param == "resume.delivered_token_ids"


def test_continued_text_sends_the_held_back_text_first() -> None:
    t = ContinuedText(pending="lo", tail="hel", stop=())
    assert t.feed(" world", final=False) == ("lo world", False)


def test_continued_text_stops_on_a_stop_string_across_the_boundary() -> None:
    t = ContinuedText(pending="", tail="the end is ne", stop=("near",))
    assert t.feed("a", final=False) == ("", False)  # "nea" could still become "near"
    assert t.feed("r and far", final=False) == ("", True)


def test_continued_text_holds_back_a_possible_stop_string_until_it_cannot_be_one() -> None:
    t = ContinuedText(pending="", tail="abc", stop=("xyz",))
    assert t.feed("def x", final=False) == ("def", False)  # " x" could start "xyz"
    assert t.feed("y", final=False) == (" ", False)
    assert t.feed("q", final=False) == ("x", False)
    assert t.feed("x", final=True) == ("yqx", False)


def test_vllm_counts_the_delivered_tokens_towards_min_tokens() -> None:
    """vLLM sees the delivered tokens as prompt: min_tokens is rebased on them, as the
    budget is, or it would outlast the rebased max_tokens (which vLLM refuses)."""
    from services.worker.vllm.resume import rebased_budget, rebased_sampling

    resume = ResumeInput(delivered_token_ids=tuple(range(30)), delivered_text_chars=0)
    sampling = SamplingOptions(max_tokens=40, min_tokens=40, seed=1)
    assert rebased_budget(40, resume) == 10
    assert rebased_sampling(sampling, resume) == SamplingOptions(
        max_tokens=40, min_tokens=10, seed=1
    )
    assert rebased_sampling(SamplingOptions(min_tokens=20), resume).min_tokens == 0
    assert rebased_sampling(SamplingOptions(seed=1), resume) == SamplingOptions(seed=1)
