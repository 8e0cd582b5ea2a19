"""Server-Sent Events, parsed incrementally: feed it whatever bytes the socket gave, get back
the ``data`` payloads of every event completed by them.

Only what OpenAI-compatible servers send is needed: ``data:`` lines (several make one payload,
joined by newlines), blank lines ending an event, ``:`` comments (keep-alives) and other
fields ignored, ``\\n`` or ``\\r\\n`` line ends. A line longer than ``max_line_bytes`` is a
broken upstream, not a reason to buffer without end.
"""

from __future__ import annotations


class SseError(ValueError):
    """The upstream's stream is not SSE we can read."""


class SseParser:
    __slots__ = ("_buffer", "_data", "_max_line")

    def __init__(self, *, max_line_bytes: int = 4 * 1024 * 1024) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._max_line = max_line_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        """The payloads of the events that ``chunk`` completes, in order."""
        buffer = self._buffer + chunk if self._buffer else chunk
        events: list[bytes] = []
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = buffer[start:end]
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            # comments (":…") and other fields (event:, id:, retry:) are ignored
        self._buffer = buffer[start:]
        if len(self._buffer) > self._max_line:
            raise SseError(f"an SSE line longer than {self._max_line} bytes")
        return events

    def pending(self) -> bool:
        """Whether an event was started but not ended (the stream was cut mid-event)."""
        return bool(self._data or self._buffer.strip())
