"""What the edge derives from a prompt without keeping it: a token estimate (for routing and
token limits) and chained hashes of its leading blocks (for prefix-cache affinity). The prompt
text itself goes only to the worker.
"""

from __future__ import annotations

import hashlib

from services.edge.openai_types import ChatCompletionRequest

CHARS_PER_TOKEN = 4
BLOCK_CHARS = 256
MAX_BLOCKS = 64


def _rendered(body: ChatCompletionRequest) -> str:
    return "".join(f"<|{m.role}|>{m.text()}\n" for m in body.messages)


#: Chat-template tokens around each message (role header, end marker) and before the answer.
TOKENS_PER_MESSAGE = 4
TOKENS_PRIMING = 3


def estimate_prompt_tokens(body: ChatCompletionRequest) -> int:
    """A cheap estimate, meant to err high: :func:`text_tokens` of everything the chat template
    renders, plus its tokens per message and before the answer.

    It sizes token-limit reservations and routing; the reservation is settled with the real
    count the worker reports, so a wrong guess costs headroom, never accuracy.
    """
    texts = [m.text() for m in body.messages]
    if body.tools:
        # Tools are rendered into the prompt by the chat template: their schemas cost tokens.
        texts += [t.model_dump_json() for t in body.tools]
    for m in body.messages:
        for call in m.tool_calls or ():
            texts += [call.function.name, call.function.arguments]
    return text_tokens(texts) + TOKENS_PER_MESSAGE * len(body.messages) + TOKENS_PRIMING


def text_tokens(texts: list[str]) -> int:
    """≈4 ASCII characters per token, and a token for every other character: CJK, emoji and
    most non-Latin scripts take one token or more per character in the tokenizers served
    (at 4 per token, 7,900 emoji were estimated at ~2,000 tokens and cost 7,900 — a tenant's
    tokens per minute overspent 4× by one request). Counted at C speed."""
    total = sum(len(t) for t in texts)
    ascii_chars = sum(len(t) if t.isascii() else len(t.encode("ascii", "ignore")) for t in texts)
    return -(-ascii_chars // CHARS_PER_TOKEN) + (total - ascii_chars)


def prefix_hashes(body: ChatCompletionRequest) -> list[int]:
    """Chained 64-bit hashes of the prompt's full ``BLOCK_CHARS`` blocks (at most MAX_BLOCKS).

    Hash *i* covers blocks 0..i, so two prompts share hash *i* exactly when they share their
    first *i+1* blocks — the router matches the longest shared prefix without seeing text.
    """
    return text_prefix_hashes(_rendered(body))


def text_prefix_hashes(prompt: str) -> list[int]:
    """:func:`prefix_hashes` of a raw prompt (completions): the same blocks and chaining."""
    text = prompt.encode()
    out: list[int] = []
    h = hashlib.blake2b(digest_size=8)
    for i in range(min(len(text) // BLOCK_CHARS, MAX_BLOCKS)):
        h.update(text[i * BLOCK_CHARS : (i + 1) * BLOCK_CHARS])
        out.append(int.from_bytes(h.copy().digest(), "big"))
    return out


def estimate_text_tokens(prompt: str | list[int]) -> int:
    """A raw prompt's tokens: exact for token ids, :func:`text_tokens` for text, plus one for
    the BOS token most tokenizers add."""
    if isinstance(prompt, list):
        return len(prompt)
    return text_tokens([prompt]) + 1
