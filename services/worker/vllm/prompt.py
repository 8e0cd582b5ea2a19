"""Chat messages → the prompt token ids the engine will see, under the model's own template.

The messages are rendered with the model's chat template (``apply_chat_template`` with
``add_generation_prompt=True``, as text) and that text is tokenized without adding special
tokens: the template already writes BOS and turn markers, as in vLLM's OpenAI server. So the
prompt is exactly the token ids the engine counts, and usage reports that count.

Where it runs: on the event loop for conversations of up to ``INLINE_RENDER_MAX_CHARS``, in a
worker thread above that. Rendering a short chat takes ~0.05 ms (the tiny test model's
tokenizer; well under 1 ms for real ones), while handing it to a thread and back costs ~1 ms at
the median and several ms under load on the project's 2-core hosts — time every request's
first token would wait. Long conversations (~2.5 ms for 10,000 characters) go to a thread, so
the loop, which streams every other request's tokens, is never held for more than a fraction
of a millisecond.

The tokenizer is duck-typed (a Hugging Face tokenizer as vLLM returns it), so this module does
not import vllm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import jinja2

from services.common.errors import InvalidRequest
from services.worker.engine import ChatTurn
from services.worker.truncation import Fitted, fit_oldest, max_prompt_tokens

INLINE_RENDER_MAX_CHARS = 2_000


def conversation_chars(messages: Sequence[ChatTurn]) -> int:
    """Characters of content and names: what rendering and tokenizing cost grows with."""
    return sum(len(turn.content) + len(turn.name) for turn in messages)


async def render_prompt(
    tokenizer: Any, messages: Sequence[ChatTurn], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """:func:`render_prompt_sync`, inline for short conversations, else in a worker thread."""
    if not tools and conversation_chars(messages) <= INLINE_RENDER_MAX_CHARS:
        return render_prompt_sync(tokenizer, messages)
    return await asyncio.to_thread(render_prompt_sync, tokenizer, messages, tools)


async def fit_prompt(
    tokenizer: Any,
    messages: Sequence[ChatTurn],
    tools: list[dict[str, Any]] | None,
    prompt_ids: list[int],
    *,
    room: int,
    max_tokens: int | None,
) -> Fitted[list[int]]:
    """``truncate_oldest``: the fewest oldest messages dropped for the prompt to fit ``room``
    tokens beside ``max_tokens`` (services/worker/truncation.py). ``prompt_ids`` are the whole
    conversation's; a conversation that fits is not rendered again, one that does not is
    re-rendered a few times (bisection) in a worker thread, as long renders are."""
    longest = max_prompt_tokens(room, max_tokens)

    def fits(ids: list[int]) -> bool:
        return len(ids) <= longest

    if fits(prompt_ids):
        return Fitted(tuple(messages), prompt_ids, 0)
    return await asyncio.to_thread(
        fit_oldest,
        messages,
        lambda kept: render_prompt_sync(tokenizer, kept, tools),
        fits,
        measured=prompt_ids,
    )


def _message(turn: ChatTurn) -> dict[str, Any]:
    """One turn as chat templates read it (OpenAI's shape, as vLLM's server passes it)."""
    out: dict[str, Any] = {"role": turn.role, "content": turn.content}
    if turn.name:
        out["name"] = turn.name
    if turn.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in turn.tool_calls
        ]
    if turn.tool_call_id:
        out["tool_call_id"] = turn.tool_call_id
    return out


def render_prompt_sync(
    tokenizer: Any, messages: Sequence[ChatTurn], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The prompt token ids of ``messages`` (and ``tools``, rendered by the model's own
    template); a template that refuses them is InvalidRequest."""
    conversation = [_message(turn) for turn in messages]
    extra: dict[str, Any] = {"tools": tools} if tools else {}
    try:
        text = tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True, **extra
        )
    except jinja2.TemplateError as err:
        raise InvalidRequest(
            f"the model's chat template rejects these messages: {err}", param="messages"
        ) from err
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
