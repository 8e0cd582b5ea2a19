"""truncate_oldest (Responses' truncation "auto"): the fewest oldest messages are dropped for
the prompt to fit, the instructions stay, a tool output never loses its call, and the sim
engine refuses what cannot fit even then."""

from __future__ import annotations

import asyncio

import pytest

from services.common.errors import ContextLengthExceeded
from services.worker.engine import ChatTurn, EngineRequest, SamplingOptions, ToolCall
from services.worker.sim.config import SimConfig
from services.worker.sim.scheduler import SimScheduler
from services.worker.sim.text import render_chat, tokenize
from services.worker.truncation import cuts, fit_oldest, fit_oldest_async, max_prompt_tokens


def turn(
    role: str, words: int, *, tool_calls: tuple[ToolCall, ...] = (), tool_call_id: str = ""
) -> ChatTurn:
    content = " ".join(f"{role}{i}" for i in range(words))
    return ChatTurn(role, content, tool_calls=tool_calls, tool_call_id=tool_call_id)


def size(messages: tuple[ChatTurn, ...]) -> int:
    """A measure: the words of content (what a tokenizer would grow with)."""
    return sum(len(m.content.split()) for m in messages)


CALL = ToolCall(id="c1", name="lookup", arguments="{}")
CONVERSATION = (
    turn("system", 5),
    turn("user", 40),
    turn("assistant", 40, tool_calls=(CALL,)),
    turn("tool", 40, tool_call_id="c1"),
    turn("assistant", 10),
    turn("user", 20),
    turn("assistant", 20),
    turn("user", 3),
)


def test_a_conversation_that_fits_is_measured_once_and_kept_whole() -> None:
    measured: list[int] = []

    def measure(ms: tuple[ChatTurn, ...]) -> int:
        measured.append(len(ms))
        return size(ms)

    fitted = fit_oldest(CONVERSATION, measure, lambda n: n <= 1000)
    assert (fitted.messages, fitted.dropped, measured) == (CONVERSATION, 0, [8])


@pytest.mark.parametrize(
    ("limit", "dropped"),
    [
        (178, 0),  # the whole conversation: 5 + 40 + 40 + 40 + 10 + 20 + 20 + 3
        (138, 4),  # not 1: the kept run starts at a user message (5 + 20 + 20 + 3 = 48)
        (48, 4),
        (47, 6),
        (8, 6),  # the instructions and the last turn: all that is left
    ],
)
def test_the_fewest_oldest_turns_are_dropped_from_a_user_message_on(
    limit: int, dropped: int
) -> None:
    fitted = fit_oldest(CONVERSATION, size, lambda n: n <= limit)
    assert fitted.dropped == dropped
    assert fitted.messages[0] == CONVERSATION[0]  # the system message stays
    assert fitted.messages[1:] == CONVERSATION[1 + dropped :]
    assert fitted.measured == size(fitted.messages)
    assert fitted.messages[1].role == "user"


def test_an_agent_loop_after_one_question_is_cut_at_an_assistant_call() -> None:
    loop: list[ChatTurn] = [turn("system", 2), turn("user", 10)]
    for i in range(20):
        call = ToolCall(id=f"c{i}", name="lookup", arguments="{}")
        loop += [turn("assistant", 5, tool_calls=(call,)), turn("tool", 15, tool_call_id=f"c{i}")]
    fitted = fit_oldest(loop, size, lambda n: n <= 2 + 5 * 20)  # five call/output pairs
    assert fitted.dropped == 1 + 2 * 15  # the question and the first fifteen pairs
    assert [m.role for m in fitted.messages[:3]] == ["system", "assistant", "tool"]
    assert fitted.messages[-1] == loop[-1]


def test_when_not_even_the_last_turn_fits_the_shortest_conversation_comes_back() -> None:
    fitted = fit_oldest(CONVERSATION, size, lambda n: n <= 3)
    assert fitted.messages == (CONVERSATION[0], CONVERSATION[-1])
    assert (fitted.dropped, fitted.measured) == (6, 8)


def test_the_search_renders_a_logarithmic_number_of_candidates() -> None:
    turns = (turn("user" if i % 2 else "assistant", 10) for i in range(200))
    long = (turn("system", 1), *turns)
    calls = 0

    def measure(ms: tuple[ChatTurn, ...]) -> int:
        nonlocal calls
        calls += 1
        return size(ms)

    fitted = fit_oldest(long, measure, lambda n: n <= 501)
    assert fitted.dropped == 151  # 50 turns would fit; the 49 from a user message on are kept
    assert calls <= 1 + 9  # the whole, then ~log2(200)


def test_a_trailing_tool_output_keeps_its_call() -> None:
    ending_in_outputs = (*CONVERSATION[:3], CONVERSATION[3])
    assert cuts(ending_in_outputs) == (1, [1], [2])
    fitted = fit_oldest(ending_in_outputs, size, lambda n: n <= 85)
    assert [m.role for m in fitted.messages] == ["system", "assistant", "tool"]


def test_the_async_search_finds_what_the_sync_one_does() -> None:
    async def measure(ms: tuple[ChatTurn, ...]) -> int:
        await asyncio.sleep(0)
        return size(ms)

    for limit in (178, 60, 25, 3):
        fits = lambda n, limit=limit: n <= limit  # noqa: E731
        got = asyncio.run(
            fit_oldest_async(CONVERSATION, measure, fits, measured=size(CONVERSATION))
        )
        assert got == fit_oldest(CONVERSATION, size, fits)


def test_without_max_tokens_room_is_kept_for_a_quarter_of_the_context_at_most_4096() -> None:
    assert max_prompt_tokens(8192, 16) == 8176
    assert max_prompt_tokens(8192, None) == 6144
    assert max_prompt_tokens(131_072, None) == 131_072 - 4096
    assert max_prompt_tokens(2, None) == 1  # always room for one token


# -- the sim engine ---------------------------------------------------------------------------

CONFIG = SimConfig(models=("meridian-sim",), max_model_len=128, kv_cache_tokens=1024)
HISTORY = (
    ChatTurn(role="developer", content="Answer briefly."),
    *(
        ChatTurn(role=("user", "assistant")[i % 2], content=" ".join(["word"] * 30))
        for i in range(6)
    ),
    ChatTurn(role="user", content="And now?"),
)


def sim_request(*, truncate: bool, max_tokens: int | None = 16) -> EngineRequest:
    return EngineRequest(
        request_id="r1",
        model="meridian-sim",
        messages=HISTORY,
        sampling=SamplingOptions(max_tokens=max_tokens),
        truncate_oldest=truncate,
    )


def test_the_sim_engine_drops_the_oldest_turns_to_fit_beside_max_tokens() -> None:
    assert len(tokenize(render_chat(HISTORY))) > 128
    with pytest.raises(ContextLengthExceeded):
        SimScheduler(CONFIG).add(sim_request(truncate=False), 0.0)
    seq = SimScheduler(CONFIG).add(sim_request(truncate=True), 0.0)
    assert seq.dropped_messages > 0
    assert len(seq.prompt_ids) + 16 <= 128
    kept = (HISTORY[0], *HISTORY[1 + seq.dropped_messages :])
    assert seq.prompt_ids == tokenize(render_chat(kept))  # the instructions and newest turns
    one_fewer = (HISTORY[0], *HISTORY[seq.dropped_messages :])
    assert len(tokenize(render_chat(one_fewer))) + 16 > 128  # no more dropped than needed


def test_without_max_tokens_the_sim_engine_leaves_a_quarter_of_the_context_to_answer() -> None:
    seq = SimScheduler(CONFIG).add(sim_request(truncate=True, max_tokens=None), 0.0)
    assert 0 < len(seq.prompt_ids) <= 128 - 32
    assert seq.max_tokens >= 32


def test_the_sim_engine_still_refuses_a_last_turn_that_cannot_fit() -> None:
    huge = EngineRequest(
        request_id="r1",
        model="meridian-sim",
        messages=(*HISTORY[:-1], ChatTurn(role="user", content=" ".join(["word"] * 200))),
        truncate_oldest=True,
    )
    with pytest.raises(ContextLengthExceeded) as refused:
        SimScheduler(CONFIG).add(huge, 0.0)
    assert refused.value.param == "messages"
