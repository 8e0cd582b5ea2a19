"""The simulator's tokenizer, chat template and text generator: lossless, stable, seeded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.worker.engine import ChatTurn, RawPrompt
from services.worker.sim.text import (
    TextGenerator,
    render_chat,
    seed_for,
    split_pieces,
    token_id,
    tokenize,
)
from services.worker.sim.validation import echo_logprobs


@given(st.text(max_size=300))
def test_pieces_concatenate_to_the_text(text: str) -> None:
    assert "".join(split_pieces(text)) == text


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("Hello, world!", ["Hello", ",", " world", "!"]),
        ("a  b", ["a", " ", " b"]),
        ("1234567", ["123", "456", "7"]),
        ("东京", ["东", "京"]),
        ("internationalization", ["internationa", "lization"]),
        ("<|user|>\nhi<|end|>\n", ["<|user|>", "\n", "hi", "<|end|>", "\n"]),
        ("x_y", ["x", "_", "y"]),
    ],
)
def test_pieces_follow_the_pre_tokenizer_rules(text: str, pieces: list[str]) -> None:
    assert split_pieces(text) == pieces


def test_token_ids_are_stable_across_processes() -> None:
    # Pinned: ids must not depend on PYTHONHASHSEED or the process, or prefix hashes computed
    # by another service would not match.
    assert token_id("hello") == 0x6A6706F7
    assert tokenize("hello hello") == [token_id("hello"), token_id(" hello")]
    assert token_id("hello") != token_id(" hello")
    assert all(0 <= t < 2**31 for t in tokenize("any text at all, 123 东"))


def test_chat_template_marks_roles_names_and_the_open_assistant_turn() -> None:
    prompt = render_chat(
        [ChatTurn(role="system", content="be brief"), ChatTurn("user", "hi", name="ann")]
    )
    assert prompt == "<|system|>\nbe brief<|end|>\n<|user name=ann|>\nhi<|end|>\n<|assistant|>\n"
    assert split_pieces(prompt)[-2:] == ["\n<|assistant|>", "\n"]


def test_same_seed_same_text_other_seed_other_text() -> None:
    def text(seed: int) -> str:
        g = TextGenerator(seed)
        return "".join(g.next_piece() for _ in range(100))

    assert text(7) == text(7)
    assert text(7) != text(8)
    assert text(7)[0].isupper()


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_every_generated_piece_is_exactly_one_token(seed: int) -> None:
    g = TextGenerator(seed)
    pieces = [g.next_piece() for _ in range(40)]
    assert all(split_pieces(p) == [p] for p in pieces)
    # And the reply re-tokenizes to the same tokens, so a later turn costs what it cost.
    assert tokenize("".join(pieces)) == [token_id(p) for p in pieces]


def test_logprobs_do_not_change_the_text_and_rank_the_chosen_piece_first() -> None:
    plain, with_lp = TextGenerator(3), TextGenerator(3)
    for _ in range(30):
        piece = plain.next_piece()
        assert with_lp.next_piece() == piece
        value, top = with_lp.logprobs(piece, 5)
        assert value < 0
        assert len(top) == 5
        assert top[0] == (piece, value)
        assert len({t for t, _ in top}) == 5
        values = [lp for _, lp in top]
        assert values == sorted(values, reverse=True)


def test_seed_for_mixes_every_part() -> None:
    assert seed_for("a", 1) == seed_for("a", 1)
    assert seed_for("a", 1) != seed_for("a", 2)
    assert seed_for("a1") != seed_for("a", 1)
    assert 0 <= seed_for("x") < 2**63


def test_a_prompt_tokens_logprob_does_not_depend_on_how_many_alternatives_are_asked() -> None:
    # A scorer (lm-evaluation-harness) sums these: logprobs=0 and logprobs=5 must agree.
    prompt = RawPrompt(text="Paris is the capital of France, and Rome of Italy")
    runs = [echo_logprobs(prompt, top) for top in (0, 1, 2, 5, 20)]
    values = [[lp.logprob for lp in run] for run in runs]
    assert all(v == values[0] for v in values[1:])
    assert [len(lp.top) for lp in runs[3][1:]] == [5] * (len(runs[3]) - 1)
