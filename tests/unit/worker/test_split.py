"""An output with too many logprob entries for one message goes out as pieces that, joined in
order, say exactly what it said (services/worker/split.py)."""

from __future__ import annotations

import pytest

from services.worker.engine import EngineOutput, FinishReason, TokenLogprob, ToolCallDelta
from services.worker.split import split_output, too_large


def lps(tokens: list[str]) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(t, -0.5, ((t, -0.5), ("x", -2.0))) for t in tokens)


def output(n: int, *, prompt: int = 0, aligned: bool = True) -> EngineOutput:
    tokens = [f" t{i}" for i in range(n)]
    return EngineOutput(
        text="".join(tokens) if aligned else "".join(tokens) + "!",
        token_ids=tuple(range(100, 100 + n)),
        finish_reason=FinishReason.LENGTH,
        prompt_tokens=max(prompt, 3),
        completion_tokens=500 + n,  # cumulative: 500 sent before this output
        cached_prompt_tokens=2,
        queue_ms=1.0,
        prefill_ms=2.0,
        decode_ms=3.0,
        logprobs=lps(tokens),
        tool_calls=(ToolCallDelta(0, "call_1", "f", "{}"),),
        handoff=True,
        prompt_text="the prompt" if prompt else "",
        prompt_logprobs=lps([f"p{i}" for i in range(prompt)]),
    )


def joined(pieces: list[EngineOutput]) -> dict[str, object]:
    return {
        "text": "".join(p.text for p in pieces),
        "ids": tuple(i for p in pieces for i in p.token_ids),
        "logprobs": tuple(lp for p in pieces for lp in p.logprobs),
        "prompt_text": "".join(p.prompt_text for p in pieces),
        "prompt_logprobs": tuple(lp for p in pieces for lp in p.prompt_logprobs),
        "tool_calls": tuple(c for p in pieces for c in p.tool_calls),
    }


def test_an_output_within_the_limit_is_itself() -> None:
    out = output(10, prompt=10)
    assert not too_large(out, 20)
    assert split_output(out, 20) == [out]


@pytest.mark.parametrize(("n", "prompt"), [(1000, 0), (0, 1000), (700, 900), (257, 1)])
def test_pieces_joined_in_order_are_the_output(n: int, prompt: int) -> None:
    out = output(n, prompt=prompt)
    pieces = split_output(out, 256)
    assert len(pieces) > 1
    assert all(len(p.logprobs) + len(p.prompt_logprobs) <= 256 for p in pieces)
    assert joined(pieces) == joined([out])
    first, last = pieces[0], pieces[-1]
    assert (first.queue_ms, first.prefill_ms) == (1.0, 2.0)
    assert all(p.queue_ms is None and p.prefill_ms is None for p in pieces[1:])
    assert (last.finish_reason, last.decode_ms, last.handoff) == (FinishReason.LENGTH, 3.0, True)
    assert all(p.finish_reason is None and not p.handoff for p in pieces[:-1])
    assert last.completion_tokens == out.completion_tokens
    assert all((p.prompt_tokens, p.cached_prompt_tokens) == (out.prompt_tokens, 2) for p in pieces)


def test_each_piece_has_its_tokens_text_and_counts_what_was_sent() -> None:
    pieces = split_output(output(600), 256)
    assert [len(p.token_ids) for p in pieces] == [256, 256, 88]
    for p in pieces:
        assert p.text == "".join(lp.token for lp in p.logprobs)
        assert p.token_ids[0] - 100 == int(p.logprobs[0].token[2:])
    assert [p.completion_tokens for p in pieces] == [756, 1012, 1100]


def test_tokens_that_do_not_spell_the_text_leave_it_whole_in_the_first_piece() -> None:
    out = output(600, aligned=False)
    pieces = split_output(out, 256)
    assert pieces[0].text == out.text
    assert pieces[0].token_ids == out.token_ids
    assert pieces[0].completion_tokens == out.completion_tokens
    assert all(not p.text and not p.token_ids for p in pieces[1:])
    assert joined(pieces) == joined([out])


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        split_output(output(3), 0)
