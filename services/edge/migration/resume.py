"""What the client has received, and the resume state that lets another worker continue it."""

from __future__ import annotations

from dataclasses import dataclass, field

from meridian.v1 import worker_pb2

#: Characters of delivered text the continuing worker gets to match stop strings against
#: (the worker accepts up to 256; stop strings are at most services.common.limits'
#: MAX_STOP_LENGTH).
TAIL_CHARS = 256


@dataclass(slots=True)
class Delivered:
    """Everything the client has been sent so far, counted from the chunks written: token ids
    (the continuing worker's token prompt), characters of text, and the text's tail."""

    token_ids: list[int] = field(default_factory=list)
    text_chars: int = 0
    tail: str = ""

    def add(self, chunk: worker_pb2.GenerateChunk) -> None:
        self.token_ids.extend(chunk.token_ids)
        if chunk.text:
            self.text_chars += len(chunk.text)
            self.tail = (self.tail + chunk.text)[-TAIL_CHARS:]


def with_resume(
    request: worker_pb2.GenerateRequest,
    delivered: Delivered,
    *,
    origin_request_id: str,
    migrations: int,
) -> worker_pb2.GenerateRequest:
    """``request`` (fresh from services/edge/upstream/protos) continuing after ``delivered``.
    Nothing delivered yet: the request as it is (a restart loses nothing)."""
    if not delivered.token_ids:
        return request
    r = request.resume
    r.delivered_token_ids.extend(delivered.token_ids)
    r.delivered_text_chars = delivered.text_chars
    r.delivered_text_tail = delivered.tail
    r.origin_request_id = origin_request_id
    r.migrations = migrations
    return request
