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

from typing import Any

from services.common.errors import InvalidRequest
from services.worker.engine import ResumeInput


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


def pending_text(tokenizer: Any, prompt_ids: list[int], resume: ResumeInput) -> str:
    """The delivered tokens' text after the ``delivered_text_chars`` the client has, decoded
    in the prompt's context (as vLLM's detokenizer does); "" if it does not line up with the
    delivered tail (nothing is invented)."""
    carried = list(resume.delivered_token_ids)
    before = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    full = tokenizer.decode(prompt_ids + carried, skip_special_tokens=True)
    out = full[len(before) :] if full.startswith(before) else ""
    sent = resume.delivered_text_chars
    if sent <= len(out) and out[:sent].endswith(resume.delivered_text_tail):
        return out[sent:]
    return ""
