"""The prompt's token estimate sizes token-limit reservations before a worker has counted:
it must not be several times too low for any script."""

from __future__ import annotations

import json

import pytest

from services.edge.openai_types import parse_chat_request
from services.edge.prompt import estimate_prompt_tokens, estimate_text_tokens, text_tokens


@pytest.mark.parametrize(
    ("text", "at_least"),
    [
        ("hello world, " * 100, 325),  # ≈4 ASCII characters per token
        ("😀" * 1000, 1000),  # emoji: a token or more each
        ("東京都" * 300, 900),  # CJK: about one token per character
        ("Привет " * 200, 200 * 6 + 200 // 4),  # Cyrillic letters count one each
    ],
)
def test_text_is_estimated_at_no_fewer_tokens_than_a_tokenizer_spends(
    text: str, at_least: int
) -> None:
    assert text_tokens([text]) >= at_least
    assert estimate_text_tokens(text) == text_tokens([text]) + 1  # and the BOS token


def test_a_chat_request_of_emoji_is_estimated_per_character() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "😀" * 7900}]}
    assert estimate_prompt_tokens(parse_chat_request(json.dumps(body).encode())) >= 7900


def test_token_ids_are_counted_exactly() -> None:
    assert estimate_text_tokens([1, 2, 3]) == 3
