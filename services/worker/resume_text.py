"""The text side of a resumed stream (mid-stream migration), for engines that cannot be told
"these tokens are already generated" — vLLM takes them as part of a token prompt.

Two things would go wrong without it. The previous worker held back the end of its text (a
possible stop string's start, an incomplete UTF-8 character): the client never got it, and
the new engine will not produce it again (it is prompt now), so it is sent first. And the
engine matches stop strings only in its own new text, so a stop string that began in the
delivered text and ends in the new one would be missed: here they are matched over the
delivered tail plus the new text, holding back ``len(longest stop) - 1`` characters as the
engine would, so a stop string never leaks into the stream.
"""

from __future__ import annotations

#: Characters of emitted text kept for matching (stop strings are far shorter).
_SEEN_CHARS = 256


class ContinuedText:
    """Feeds an engine's text deltas; returns what to stream and whether a stop string ended it."""

    def __init__(self, *, pending: str, tail: str, stop: tuple[str, ...]) -> None:
        self._buf = pending
        self._seen = tail[-_SEEN_CHARS:]
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1

    def feed(self, text: str, *, final: bool) -> tuple[str, bool]:
        """``text``: the engine's next delta. Returns (text to send now, stopped)."""
        self._buf += text
        if self._stop:
            window = self._seen + self._buf
            start = max(0, len(self._seen) - self._hold)
            found = [i for i in (window.find(s, start) for s in self._stop) if i >= 0]
            if found:
                cut = min(found) - len(self._seen)
                emit = self._buf[: max(0, cut)]
                self._buf = ""
                return emit, True
        keep = 0 if final or not self._stop else min(self._hold, len(self._buf))
        emit = self._buf[: len(self._buf) - keep]
        self._buf = self._buf[len(self._buf) - keep :]
        self._seen = (self._seen + emit)[-_SEEN_CHARS:]
        return emit, False
