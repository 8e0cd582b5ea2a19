"""OpenAI response shapes: ``chat.completion``, ``chat.completion.chunk`` and usage.

Pure functions of their inputs, so the exact wire format is tested without a server.
"""

from __future__ import annotations

import json
from typing import Any

from meridian.v1 import worker_pb2

FINISH_REASONS = {
    worker_pb2.FINISH_REASON_STOP: "stop",
    worker_pb2.FINISH_REASON_LENGTH: "length",
    # FINISH_REASON_ABORT never reaches a client: the migration driver moves a handed-back
    # stream to another worker or ends it with an error event (services/edge/migration/).
    worker_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}


def usage_dict(usage: worker_pb2.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
    }


def logprobs_dict(chunks: list[worker_pb2.TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": lp.token,
                "logprob": lp.logprob,
                "bytes": list(lp.token.encode()),
                "top_logprobs": [
                    {"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode())}
                    for t in lp.top
                ],
            }
            for lp in chunks
        ]
    }


class ChunkRenderer:
    """Renders the SSE ``data:`` payloads of one streamed completion."""

    def __init__(
        self, *, completion_id: str, model: str, created: int, fingerprint: str, usage: bool
    ) -> None:
        self._head = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint,
        }
        self._usage = usage
        # The hot path (one text delta, no logprobs) splices the JSON-escaped text between two
        # fixed byte strings rendered once: the same bytes json.dumps would produce for the
        # whole chunk (tests/unit/edge/test_render.py pins that), at a fraction of the cost.
        whole = self._chunk({"content": "\x00"}, None)
        marker = whole.index(b'"\\u0000"')
        self._content_head = whole[:marker]
        self._content_tail = whole[marker + len(b'"\\u0000"') :]

    def _chunk(
        self, delta: dict[str, Any], finish: str | None, logprobs: Any = None, index: int = 0
    ) -> bytes:
        body: dict[str, Any] = {
            **self._head,
            "choices": [
                {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            ],
        }
        if self._usage:
            body["usage"] = None
        return sse_data(body)

    def role(self, index: int = 0) -> bytes:
        return self._chunk({"role": "assistant", "content": ""}, None, index=index)

    def content(self, chunk: worker_pb2.GenerateChunk) -> bytes | None:
        """The chunk's delta: text (the hot path: choice 0, text only), logprobs, and tool-call
        pieces in OpenAI's incremental shape (``tool_deltas``)."""
        if chunk.tool_calls or chunk.index:
            if not (chunk.text or chunk.logprobs or chunk.tool_calls):
                return None
            delta: dict[str, Any] = {}
            if chunk.text:
                delta["content"] = chunk.text
            if chunk.tool_calls:
                delta["tool_calls"] = tool_deltas(chunk.tool_calls)
            lp = logprobs_dict(list(chunk.logprobs)) if chunk.logprobs else None
            return self._chunk(delta, None, lp, index=chunk.index)
        if chunk.logprobs:
            return self._chunk({"content": chunk.text}, None, logprobs_dict(list(chunk.logprobs)))
        if not chunk.text:
            return None
        return self._content_head + json.dumps(chunk.text).encode() + self._content_tail

    def finish(self, reason: str, index: int = 0, extension: dict[str, Any] | None = None) -> bytes:
        """The chunk with choice ``index``'s finish reason; ``extension`` goes in a
        ``meridian`` object (migrations, final region and worker), which OpenAI's SDKs keep as
        an extra field."""
        if extension is None:
            return self._chunk({}, reason, index=index)
        body: dict[str, Any] = {
            **self._head,
            "choices": [{"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}],
        }
        if self._usage:
            body["usage"] = None
        body["meridian"] = extension
        return sse_data(body)

    def usage(self, usage: worker_pb2.Usage, extension: dict[str, Any] | None = None) -> bytes:
        body: dict[str, Any] = {**self._head, "choices": [], "usage": usage_dict(usage)}
        if extension is not None:
            body["meridian"] = extension
        return sse_data(body)


def tool_deltas(calls: Any) -> list[dict[str, Any]]:
    """Worker tool-call pieces → OpenAI's ``delta.tool_calls``: the first piece of a call has
    ``index``, ``id``, ``type`` and ``function.name`` (and ``arguments``, maybe empty); later
    pieces only ``index`` and ``function.arguments`` — what the SDKs' stream helpers join."""
    out: list[dict[str, Any]] = []
    for c in calls:
        if c.id:
            out.append(
                {
                    "index": c.index,
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
            )
        else:
            out.append({"index": c.index, "function": {"arguments": c.arguments}})
    return out


class ChoiceAssembler:
    """Joins the chunks of every choice of a non-streamed completion into its ``choices``."""

    def __init__(self, *, choices: int, logprobs: bool) -> None:
        self._text: list[list[str]] = [[] for _ in range(choices)]
        self._calls: list[dict[int, dict[str, str]]] = [{} for _ in range(choices)]
        self._logprobs: list[list[worker_pb2.TokenLogprob]] | None = (
            [[] for _ in range(choices)] if logprobs else None
        )
        self._finish: list[str | None] = [None] * choices

    def add(self, chunk: worker_pb2.GenerateChunk) -> None:
        i = chunk.index
        if i >= len(self._text):
            return  # a choice nobody asked for: ignore rather than fail the others
        if chunk.text:
            self._text[i].append(chunk.text)
        for c in chunk.tool_calls:
            call = self._calls[i].setdefault(c.index, {"id": "", "name": "", "arguments": ""})
            if c.id:
                call["id"], call["name"] = c.id, c.name
            call["arguments"] += c.arguments
        if self._logprobs is not None:
            self._logprobs[i].extend(chunk.logprobs)
        if chunk.finish_reason != worker_pb2.FINISH_REASON_UNSPECIFIED:
            self._finish[i] = FINISH_REASONS.get(chunk.finish_reason, "stop")

    def tool_calls(self) -> int:
        return sum(len(calls) for calls in self._calls)

    def choices(self) -> list[dict[str, Any]]:
        out = []
        for i, parts in enumerate(self._text):
            message: dict[str, Any] = {"role": "assistant", "content": "".join(parts)}
            calls = self._calls[i]
            if calls:
                message["content"] = message["content"] or None
                message["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for _, c in sorted(calls.items())
                ]
            message["refusal"] = None
            lp = logprobs_dict(self._logprobs[i]) if self._logprobs is not None else None
            out.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": lp,
                    "finish_reason": self._finish[i] or "length",
                }
            )
        return out


def sse_data(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
SSE_KEEPALIVE = b": keep-alive\n\n"


def completion_body(
    *,
    completion_id: str,
    model: str,
    created: int,
    fingerprint: str,
    text: str,
    finish: str,
    usage: worker_pb2.Usage,
    logprobs: list[worker_pb2.TokenLogprob] | None,
    choices: list[dict[str, Any]] | None = None,
    extension: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion``: a single choice from ``text``/``finish``/``logprobs``, or
    ``choices`` as :class:`ChoiceAssembler` renders them; ``extension`` in ``meridian``."""
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": choices
        if choices is not None
        else [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": logprobs_dict(logprobs) if logprobs is not None else None,
                "finish_reason": finish,
            }
        ],
        "usage": usage_dict(usage),
    }
    if extension is not None:
        body["meridian"] = extension
    return body
