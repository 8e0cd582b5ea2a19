"""Chat messages → prompt token ids (services/worker/vllm/prompt.py) with the tiny model's own
tokenizer and chat template: the same ids whether rendered on the loop or in a thread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from services.common.errors import InvalidRequest
from services.worker.engine import ChatTurn
from services.worker.vllm.prompt import (
    INLINE_RENDER_MAX_CHARS,
    conversation_chars,
    render_prompt,
    render_prompt_sync,
)

pytestmark = pytest.mark.vllm


class RecordingTokenizer:
    """The real tokenizer, noting the thread each render ran on."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.threads: list[str] = []

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        return self._tokenizer.apply_chat_template(conversation, **kwargs)

    def encode(self, text: str, **kwargs: Any) -> Any:
        return self._tokenizer.encode(text, **kwargs)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def expected_ids(tokenizer: Any, messages: tuple[ChatTurn, ...]) -> list[int]:
    conversation = [{"role": m.role, "content": m.content} for m in messages]
    ids = tokenizer.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"])


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("Count to three.", "loop"),
        ("x" * INLINE_RENDER_MAX_CHARS, "loop"),
        ("x" * (INLINE_RENDER_MAX_CHARS + 1), "thread"),
    ],
    ids=["short", "at-the-limit", "past-the-limit"],
)
async def test_short_conversations_render_on_the_loop_long_ones_in_a_thread_to_the_same_ids(
    tokenizer: Any, content: str, where: str
) -> None:
    messages = (ChatTurn(role="user", content=content),)
    recording = RecordingTokenizer(tokenizer)

    ids = await render_prompt(recording, messages)

    assert ids == expected_ids(tokenizer, messages)
    on_loop = recording.threads == [threading.current_thread().name]
    assert on_loop is (where == "loop")


def test_names_count_toward_the_size_of_a_conversation() -> None:
    messages = (
        ChatTurn(role="system", content="abc"),
        ChatTurn(role="user", content="de", name="fgh"),
    )

    assert conversation_chars(messages) == 8


def test_a_template_that_refuses_the_messages_is_an_invalid_request_naming_messages(
    tiny_model_dir: Path,
) -> None:
    # A real tokenizer whose template refuses, as Llama-2-style templates do for bad role orders.
    strict = AutoTokenizer.from_pretrained(tiny_model_dir)
    strict.chat_template = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
        "{% endif %}{{ messages[0]['content'] }}"
    )

    with pytest.raises(InvalidRequest) as raised:
        render_prompt_sync(strict, (ChatTurn(role="assistant", content="hi"),))

    assert raised.value.param == "messages"
    assert "must alternate" in raised.value.message
