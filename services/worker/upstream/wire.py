"""What travels to and from the upstream: the request body, and its stream turned into
:class:`EngineOutput` deltas.

Request: the chat messages and the OpenAI sampling fields the edge validated, ``stream: true``
and ``stream_options: {include_usage: true}`` so the last event carries the upstream's own
token counts. ``ignore_eos`` (a vLLM/SGLang extension) is sent only when set, so a strict
OpenAI-compatible server is never sent a field it does not know.

Stream: :class:`StreamAssembler` takes the payloads of every SSE event one socket read gave
and makes *one* output of them. When the worker keeps up that is one token per output, at once;
when the consumer (gRPC, the edge) is behind, the events pile up in the socket and the next
read merges them — fewer, fuller messages under load, with no timer anywhere. Completion
tokens count the upstream's logprob entries when it sends them, else its content-bearing
chunks (one token each, as vLLM and SGLang stream), until the final usage replaces the count
with the upstream's own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from services.common.errors import UpstreamFailed
from services.worker.engine import (
    ChatTurn,
    EngineOutput,
    EngineRequest,
    FinishReason,
    TokenLogprob,
)

_FINISH = {"length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def chat_messages(messages: Sequence[ChatTurn]) -> list[dict[str, str]]:
    """The conversation as an OpenAI ``messages`` array (role, content, name)."""
    return [
        {"role": t.role, "content": t.content, **({"name": t.name} if t.name else {})}
        for t in messages
    ]


def request_body(request: EngineRequest, upstream_model: str) -> dict[str, Any]:
    """The ``POST /v1/chat/completions`` body for ``request``, sent as ``upstream_model``."""
    s = request.sampling
    body: dict[str, Any] = {
        "model": upstream_model,
        "messages": chat_messages(request.messages),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    optional = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_tokens": s.max_tokens,
        "seed": s.seed,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if s.stop:
        body["stop"] = list(s.stop)
    if s.logprobs:
        body["logprobs"] = True
        if s.top_logprobs:
            body["top_logprobs"] = s.top_logprobs
    if s.ignore_eos:
        body["ignore_eos"] = True
    return body


def _finish(reason: object) -> FinishReason:
    """ "length" and "abort" as such; "stop" and everything else a server may say
    ("tool_calls", "content_filter", "eos") ended the text normally."""
    return _FINISH.get(str(reason), FinishReason.STOP)


def _logprobs(entry: Any) -> list[TokenLogprob]:
    content = entry.get("content") if isinstance(entry, dict) else None
    if not isinstance(content, list):
        return []
    out = []
    for item in content:
        if not isinstance(item, dict):
            continue
        top = item.get("top_logprobs") or []
        out.append(
            TokenLogprob(
                token=str(item.get("token", "")),
                logprob=_float(item.get("logprob")),
                top=tuple(
                    (str(t.get("token", "")), _float(t.get("logprob")))
                    for t in top
                    if isinstance(t, dict)
                ),
            )
        )
    return out


def _float(value: object) -> float:
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return -math.inf
    return f if not math.isnan(f) else -math.inf


class StreamAssembler:
    """One request's upstream events → its outputs, keeping the cumulative counts.

    ``feed(payloads)`` returns the output those events make, or None when they carried
    nothing to pass on (a role-only first chunk, a keep-alive). ``done`` turns true with the
    ``[DONE]`` sentinel, or once the finish reason and the usage have both arrived.
    """

    __slots__ = ("_cached", "_completion", "_finish", "_prompt", "_usage_seen", "done")

    def __init__(self) -> None:
        self._completion = 0
        self._prompt = 0
        self._cached = 0
        self._finish: FinishReason | None = None
        self._usage_seen = False
        self.done = False

    @property
    def finish_reason(self) -> FinishReason | None:
        return self._finish

    @property
    def completion_tokens(self) -> int:
        return self._completion

    @property
    def prompt_tokens(self) -> int:
        return self._prompt

    def feed(self, payloads: list[bytes]) -> EngineOutput | None:
        texts: list[str] = []
        logprobs: list[TokenLogprob] = []
        for payload in payloads:
            if self.done:
                break
            if payload.strip() == b"[DONE]":
                self.done = True
                break
            self._event(payload, texts, logprobs)
        if self._finish is not None and self._usage_seen:
            self.done = True
        text = "".join(texts)
        if not text and not logprobs and not self.done:
            return None
        return EngineOutput(
            text=text,
            finish_reason=self._finish if self.done else None,
            prompt_tokens=self._prompt,
            completion_tokens=self._completion,
            cached_prompt_tokens=self._cached,
            logprobs=tuple(logprobs),
        )

    def ended_without_finish(self) -> EngineOutput | None:
        """The final output when the stream ended after a finish reason but without usage
        or ``[DONE]`` (servers that ignore ``include_usage``); None if it never finished."""
        if self._finish is None:
            return None
        self.done = True
        return EngineOutput(
            text="",
            finish_reason=self._finish,
            prompt_tokens=self._prompt,
            completion_tokens=self._completion,
            cached_prompt_tokens=self._cached,
        )

    def _event(self, payload: bytes, texts: list[str], logprobs: list[TokenLogprob]) -> None:
        try:
            event = json.loads(payload)
        except (ValueError, RecursionError):
            raise UpstreamFailed("the upstream sent an event that is not JSON") from None
        if not isinstance(event, dict):
            raise UpstreamFailed("the upstream sent an event that is not a JSON object")
        error = event.get("error")
        if error:
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise UpstreamFailed(f"the upstream failed the request: {message}"[:1000])
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content") if isinstance(delta, dict) else None
            entries = _logprobs(choice.get("logprobs"))
            if entries:
                logprobs.extend(entries)
                self._completion += len(entries)
            elif content:
                self._completion += 1
            if content:
                texts.append(str(content))
            reason = choice.get("finish_reason")
            if reason:
                self._finish = _finish(reason)
        usage = event.get("usage")  # after the choices: its count replaces ours
        if isinstance(usage, dict) and usage:
            self._usage(usage)

    def _usage(self, usage: dict[str, Any]) -> None:
        completion = usage.get("completion_tokens")
        prompt = usage.get("prompt_tokens")
        if isinstance(completion, int) and completion >= 0:
            self._completion = completion
            self._usage_seen = True
        if isinstance(prompt, int) and prompt >= 0:
            self._prompt = prompt
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            self._cached = details["cached_tokens"]
