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

    def _chunk(self, delta: dict[str, Any], finish: str | None, logprobs: Any = None) -> bytes:
        body: dict[str, Any] = {
            **self._head,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            ],
        }
        if self._usage:
            body["usage"] = None
        return sse_data(body)

    def role(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""}, None)

    def content(self, chunk: worker_pb2.GenerateChunk) -> bytes | None:
        if chunk.logprobs:
            return self._chunk({"content": chunk.text}, None, logprobs_dict(list(chunk.logprobs)))
        if not chunk.text:
            return None
        return self._content_head + json.dumps(chunk.text).encode() + self._content_tail

    def finish(self, reason: str, extension: dict[str, Any] | None = None) -> bytes:
        """The chunk with the finish reason; ``extension`` goes in a ``meridian`` object
        (migrations, final region and worker), which OpenAI's SDKs keep as an extra field."""
        if extension is None:
            return self._chunk({}, reason)
        body: dict[str, Any] = {
            **self._head,
            "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}],
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
    extension: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [
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
