"""The upstream's refusals → Meridian's errors, so the edge answers (or fails over) as it would
for any worker.

- 400 / 422: the request's fault: :class:`InvalidRequest` (``ContextLengthExceeded`` when the
  upstream says so) with the upstream's message and ``param``;
- 404: :class:`ModelNotFound`;
- 401 / 403: this worker's key is wrong — not the client's fault, and another worker may do:
  :class:`Unavailable`, naming ``--upstream-api-key-file``;
- 429: :class:`Overloaded` (its ``Retry-After`` kept);
- 5xx and anything else: :class:`Unavailable` (retry elsewhere; no token was sent yet).

Messages are cut to ``MAX_MESSAGE_CHARS``: an upstream's error page is not the client's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from services.common.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    MeridianError,
    ModelNotFound,
    Overloaded,
    Unavailable,
)

MAX_MESSAGE_CHARS = 500


def _parse(body: bytes) -> tuple[str, str | None, str | None]:
    """(message, param, code) from an OpenAI-style error body, or the body's start."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body[:MAX_MESSAGE_CHARS].decode("utf-8", "replace").strip(), None, None
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        message = str(error.get("message") or error.get("detail") or "")
        param = error.get("param")
        code = error.get("code")
        return (
            message[:MAX_MESSAGE_CHARS],
            str(param)[:128] if param else None,
            str(code)[:64] if code else None,
        )
    return str(error)[:MAX_MESSAGE_CHARS], None, None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    try:
        value = float(headers.get("Retry-After", ""))
    except ValueError:
        return None
    return value if 0 <= value <= 3600 else None


def from_status(status: int, body: bytes, headers: Mapping[str, str]) -> MeridianError:
    message, param, code = _parse(body)
    said = f": {message}" if message else ""
    if status in (400, 422):
        context = code == "context_length_exceeded" or "context length" in message.lower()
        cls = ContextLengthExceeded if context else InvalidRequest
        return cls(message or f"the upstream refused the request (HTTP {status})", param=param)
    if status == 404:
        return ModelNotFound(message or "the upstream does not serve this model", param="model")
    if status in (401, 403):
        return Unavailable(
            f"the upstream refused this worker's credentials (HTTP {status}); "
            "check --upstream-api-key-file"
        )
    if status == 429:
        return Overloaded(
            f"the upstream is busy (HTTP 429){said}", retry_after_s=_retry_after(headers)
        )
    return Unavailable(f"the upstream failed (HTTP {status}){said}")
