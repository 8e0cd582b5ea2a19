"""A migrated stream continued on vLLM: the delivered token ids join the prompt's as a token
prompt (never re-tokenised text: a re-encoded boundary can shift), the completion budget is
rebased on what is left, and the delivered tokens' text the client has not seen is recovered.

The tokenizer is duck-typed (a Hugging Face tokenizer), so this module does not import vllm.

What differs from an uninterrupted stream (docs/migration.md): vLLM's per-request ``seed``
generator restarts at the boundary (sampled streams continue with a different draw; greedy
ones are unaffected), and ``presence_penalty`` / ``frequency_penalty`` count only tokens
generated after the boundary (vLLM computes them over output tokens; the delivered ones are
prompt here).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from services.common.errors import InvalidRequest
from services.worker.engine import ResumeInput, SamplingOptions


def rebased_budget(budget: int, resume: ResumeInput) -> int:
    """Tokens left to generate once the delivered ones count as generated."""
    left = budget - len(resume.delivered_token_ids)
    if left < 1:
        raise InvalidRequest(
            f"resume.delivered_token_ids has {len(resume.delivered_token_ids)} tokens; nothing "
            f"is left of this request's {budget}-token budget",
            param="resume.delivered_token_ids",
        )
    return left


def rebased_sampling(sampling: SamplingOptions, resume: ResumeInput) -> SamplingOptions:
    """``min_tokens`` counts the delivered tokens as generated, as ``max_tokens`` does
    (:func:`rebased_budget`): vLLM sees them as prompt, so left as it is it would hold off
    end-of-sequence for ``min_tokens`` more tokens than the uninterrupted stream — or refuse
    the request once it exceeds the rebased ``max_tokens``, so that a stream with
    ``min_tokens`` could not move."""
    if not sampling.min_tokens:
        return sampling
    left = max(0, sampling.min_tokens - len(resume.delivered_token_ids))
    return dataclasses.replace(sampling, min_tokens=left)


#: Tokens of context an incremental decode looks back over (a character spans at most 4
#: byte tokens; a word's leading-space rule needs one token before it).
_CONTEXT_TOKENS = 6


class TokenText:
    """Incremental detokenisation of a continued stream, from token ids.

    vLLM's own detokenizer is not used for a continued stream: it starts from the token
    prompt, and when the prompt ends in tokens that do not decode to whole characters (the
    previous worker's held-back bytes) vLLM 0.32 emits the prompt's text again in the first
    delta. This is the usual prefix/read-offset scheme: decode a few tokens of context plus
    the new ones, emit what grew, hold back an incomplete character (U+FFFD at the end) until
    the tokens that complete it arrive (or the stream ends)."""

    def __init__(self, tokenizer: Any, context_ids: list[int]) -> None:
        self._tok = tokenizer
        self._ids = list(context_ids)
        self._prefix = max(0, len(self._ids) - _CONTEXT_TOKENS)
        self._read = len(self._ids)

    def push(self, new_ids: tuple[int, ...] | list[int], *, whole: bool = False) -> str:
        """The text the new ids add; ``whole``: even if it ends in an incomplete character
        (otherwise held back, and dropped at the end of the stream, as vLLM does)."""
        self._ids.extend(new_ids)
        decode = self._tok.decode
        before = decode(self._ids[self._prefix : self._read], skip_special_tokens=True)
        after = decode(self._ids[self._prefix :], skip_special_tokens=True)
        if len(after) <= len(before) or (after.endswith("\ufffd") and not whole):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return str(after[len(before) :])


def continue_text(
    tokenizer: Any, prompt_ids: list[int], resume: ResumeInput
) -> tuple[TokenText, str]:
    """The decoder for the new tokens, and the delivered tokens' text after the
    ``delivered_text_chars`` the client has ("" if it does not line up with the delivered
    tail: nothing is invented)."""
    text = TokenText(tokenizer, prompt_ids)
    # whole: the delivered tokens' text is taken whole, an incomplete last character included
    # (as U+FFFD), so the new tokens' text starts after it. Known limit: a character split
    # across the boundary comes out as U+FFFD rather than whole.
    out = text.push(list(resume.delivered_token_ids), whole=True)
    sent = resume.delivered_text_chars
    if sent <= len(out) and out[:sent].endswith(resume.delivered_text_tail):
        return text, out[sent:]
    return text, ""
