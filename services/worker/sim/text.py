"""Deterministic text for the simulator: a chat template, a tokenizer and a text generator.

No model, no vocabulary file: what matters to a performance model is *how many* tokens a prompt
has, that identical text gives identical token ids (so prefix caching works), and that a
request's output is reproducible from its seed.

- :func:`render_chat` joins the messages with a ChatML-like template and ends with the
  assistant marker, as a real chat template does.
- :func:`tokenize` splits text into pieces in the spirit of GPT-style pre-tokenizers: a template
  marker, one CJK character, up to three digits, up to 12 letters or one other symbol, each with
  at most one leading space; runs of whitespace are pieces of their own. Concatenating the
  pieces gives the text back. Each piece is one token whose id is a stable 31-bit hash of it,
  so ids agree across processes and runs.
- :class:`TextGenerator` draws words and punctuation from a fixed list with
  ``random.Random(seed)``. Every piece it produces is exactly one token under :func:`tokenize`,
  so a reply fed back in the next turn of a conversation costs what it cost to generate.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import re
from collections.abc import Iterable, Sequence

from services.worker.engine import ChatTurn, ToolSpec

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
_PIECE = re.compile(
    r"\s*<\|[a-z_]{1,20}(?: name=[^|<>]{0,64})?\|>"  # chat-template markers
    rf"| ?[{_CJK}]"  # CJK: one character per token
    r"| ?\d{1,3}"  # numbers: three digits per token
    r"| ?[^\W\d_]{1,12}"  # words: up to 12 letters per token
    r"| ?(?:[^\s\w]|_)"  # any other symbol
    r"|\s+(?!\S)"  # whitespace run, leaving one space for the next word
    r"|\s+"
)

ROLE_MARKER = "<|{role}|>"
END_MARKER = "<|end|>"


def render_chat(messages: Iterable[ChatTurn], tools: Sequence[ToolSpec] = ()) -> str:
    """The prompt the model would see: the tools (as JSON, so they cost prompt tokens), one
    ``<|role|>`` block per message (an assistant's calls as JSON after its text), then the
    open ``<|assistant|>`` turn the completion continues."""
    parts: list[str] = []
    if tools:
        specs = [
            {"name": t.name, "description": t.description, "parameters": t.parameters}
            for t in tools
        ]
        parts.append(f"<|tools|>\n{json.dumps(specs, sort_keys=True)}{END_MARKER}\n")
    for turn in messages:
        marker = f"<|{turn.role} name={turn.name}|>" if turn.name else f"<|{turn.role}|>"
        content = turn.content
        if turn.tool_calls:
            calls = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls
            ]
            content += json.dumps(calls)
        parts.append(f"{marker}\n{content}{END_MARKER}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def split_pieces(text: str) -> list[str]:
    """The text's token pieces, in order; ``"".join(split_pieces(t)) == t``."""
    return _PIECE.findall(text)


@functools.lru_cache(maxsize=65536)
def token_id(piece: str) -> int:
    """Stable id of one piece: the first 31 bits of its BLAKE2b digest."""
    digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def tokenize(text: str) -> list[int]:
    return [token_id(piece) for piece in split_pieces(text)]


def seed_for(*parts: str | int) -> int:
    """A 63-bit seed mixed from strings and integers (request id, user seed, prompt digest)."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(repr(part).encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "big") >> 1


_WORD_LIST = """
    the model request region router worker token cache prefix batch latency network edge
    stream cluster answer question system data value result signal queue memory compute
    a an of to in for on with by from as at that this it is are was be can will may
    should would could not only also more less fast slow near far high low new old first
    last next each every some many few all most other same different simple clear good
    time step load rate path user client server engine policy limit window score weight
    region capacity traffic flow packet route decision reason health state model answer
    because while when where which what how why then than so if but and or yet still
"""
_WORDS = tuple(dict.fromkeys(_WORD_LIST.split()))
_PUNCT_AFTER_WORDS = (4, 14)  # a comma or a full stop every 4..14 words


class TextGenerator:
    """Produces one piece (token) at a time, deterministically from ``seed``.

    Words carry their leading space; a sentence starts capitalised and ends with a full stop,
    with the occasional comma inside. Log-probabilities, when asked for, come from a second
    generator seeded from the same seed, so asking for them does not change the text.
    """

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._lp_rng = random.Random(seed ^ 0x5DEECE66D)
        # The alternatives draw from their own stream, so a token's logprob does not depend on
        # how many alternatives were asked for (a scorer's loglikelihood must not change with
        # logprobs=k).
        self._alt_rng = random.Random(seed ^ 0x2545F491)
        self._words_left = self._rng.randint(*_PUNCT_AFTER_WORDS)
        self._sentence_start = True
        self._first = True

    def next_piece(self) -> str:
        if self._words_left == 0:
            self._words_left = self._rng.randint(*_PUNCT_AFTER_WORDS)
            if self._rng.random() < 0.3:
                return ","
            self._sentence_start = True
            return "."
        self._words_left -= 1
        word = self._rng.choice(_WORDS)
        if self._sentence_start:
            word = word.capitalize()
            self._sentence_start = False
        if self._first:
            self._first = False
            return word
        return " " + word

    def logprobs(self, piece: str, top: int) -> tuple[float, tuple[tuple[str, float], ...]]:
        """A plausible log-probability for ``piece`` and ``top`` alternatives: the chosen piece
        first (it is the most likely, p >= 0.5), then distinct others sharing part of the rest
        of the probability mass, in decreasing order."""
        p = self._lp_rng.uniform(0.5, 0.99)
        logprob = math.log(p)
        if top <= 0:
            return logprob, ()
        others: list[tuple[str, float]] = []
        remaining = 1.0 - p
        for word in self._alt_rng.sample(_WORDS, min(top, len(_WORDS) - 1) + 1):
            alt = " " + word
            if alt == piece or len(others) == top - 1:
                continue
            share = remaining * self._alt_rng.uniform(0.3, 0.7)
            remaining -= share
            others.append((alt, math.log(max(share, 1e-12))))
        others.sort(key=lambda item: item[1], reverse=True)
        return logprob, ((piece, logprob), *others)
