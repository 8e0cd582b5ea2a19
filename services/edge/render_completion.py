"""OpenAI's ``text_completion`` shapes (POST /v1/completions): the whole response, the
streamed chunks, and the legacy logprobs object ``{tokens, token_logprobs, top_logprobs,
text_offset}``.

Pure functions of their inputs, so the wire format is tested without a server. With ``echo``
the prompt comes first in ``text`` and in the logprobs; the prompt's first token has no
logprob (``null``, as OpenAI), ``text_offset`` counts characters of the choice's ``text``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meridian.v1 import worker_pb2
from services.edge.render import sse_data


def usage_dict(usage: worker_pb2.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


class LogprobsBuilder:
    """The legacy logprobs of one choice, built from token entries as they stream."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []
        self._offset = 0
        self._sent = 0  # entries already handed out by delta()
        self._prompt_started = False

    def add(self, entries: Sequence[worker_pb2.TokenLogprob], *, prompt: bool = False) -> None:
        """``prompt``: entries of the echoed prompt, whose very first token has no logprob
        (a long prompt's entries come in several chunks: services/worker/split.py)."""
        for lp in entries:
            first_of_prompt = prompt and not self._prompt_started
            self._prompt_started |= prompt
            self.tokens.append(lp.token)
            self.token_logprobs.append(None if first_of_prompt else lp.logprob)
            self.top_logprobs.append(None if first_of_prompt else _top(lp))
            self.text_offset.append(self._offset)
            self._offset += len(lp.token)

    def skip_text(self, text: str) -> None:
        """Text without token entries (echo without logprobs cannot happen; kept exact)."""
        self._offset += len(text)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }

    def delta(self) -> dict[str, Any]:
        """What was added since the previous delta (streaming); ``as_dict`` still has all."""
        i, self._sent = self._sent, len(self.tokens)
        return {
            "tokens": self.tokens[i:],
            "token_logprobs": self.token_logprobs[i:],
            "top_logprobs": self.top_logprobs[i:],
            "text_offset": self.text_offset[i:],
        }


def _top(lp: worker_pb2.TokenLogprob) -> dict[str, float]:
    """The ``logprobs`` most likely tokens and the sampled one, as OpenAI's legacy API and
    vLLM give them ("up to logprobs+1 elements"): ``logprobs: 0`` is the sampled token alone,
    not an empty dict."""
    top = {t.token: t.logprob for t in lp.top}
    top.setdefault(lp.token, lp.logprob)
    return top


def choice(
    *, index: int, text: str, logprobs: dict[str, Any] | None, finish: str | None
) -> dict[str, Any]:
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}


def completion_body(
    *,
    completion_id: str,
    model: str,
    created: int,
    fingerprint: str,
    choices: list[dict[str, Any]],
    usage: worker_pb2.Usage,
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": choices,
        "usage": usage_dict(usage),
    }


class CompletionChunkRenderer:
    """The SSE ``data:`` payloads of one streamed text completion."""

    def __init__(
        self, *, completion_id: str, model: str, created: int, fingerprint: str, usage: bool
    ) -> None:
        self._head = {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint,
        }
        self._usage = usage

    def chunk(
        self, *, index: int, text: str, logprobs: dict[str, Any] | None, finish: str | None
    ) -> bytes:
        body: dict[str, Any] = {
            **self._head,
            "choices": [choice(index=index, text=text, logprobs=logprobs, finish=finish)],
        }
        if self._usage:
            body["usage"] = None
        return sse_data(body)

    def usage(self, usage: worker_pb2.Usage) -> bytes:
        return sse_data({**self._head, "choices": [], "usage": usage_dict(usage)})
