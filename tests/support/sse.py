"""A raw SSE chat client for migration and chaos checks: every event kept, the gap between
two tokens measured, the ``meridian`` extension, error events and ``[DONE]`` seen as sent
(the OpenAI SDK hides some of that)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class StreamResult:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    text: str = ""
    content_chunks: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    meridian: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    done: bool = False
    max_gap_s: float = 0.0
    body: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.done and bool(self.finish_reason)


OnContent = Callable[[StreamResult], Awaitable[None] | None]


async def chat_stream(
    session: aiohttp.ClientSession,
    base_url: str,
    key: str,
    body: dict[str, Any],
    *,
    on_content: OnContent | None = None,
) -> StreamResult:
    """POST a streamed chat completion and read it to the end (or to the connection's end).
    ``on_content`` runs after each content chunk (a test kills a worker there)."""
    res = StreamResult()
    payload = {**body, "stream": True}
    payload.setdefault("stream_options", {"include_usage": True})
    async with session.post(
        f"{base_url}/chat/completions",
        json=payload,
        headers={"Authorization": f"Bearer {key}"},
    ) as resp:
        res.status = resp.status
        res.headers = dict(resp.headers)
        if resp.status != 200:
            res.body = await resp.text()
            return res
        last = time.monotonic()
        buf = b""
        async for data in resp.content.iter_any():
            buf += data
            while b"\n\n" in buf:
                raw, buf = buf.split(b"\n\n", 1)
                line = raw.decode()
                if not line.startswith("data: "):
                    continue
                item = line[len("data: ") :]
                if item == "[DONE]":
                    res.done = True
                    continue
                obj = json.loads(item)
                if "error" in obj:
                    res.error = obj["error"]
                    continue
                if obj.get("meridian") is not None:
                    res.meridian = obj["meridian"]
                if obj.get("usage"):
                    res.usage = obj["usage"]
                for choice in obj.get("choices", []):
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
                    content = choice.get("delta", {}).get("content")
                    if content:
                        now = time.monotonic()
                        if res.content_chunks:
                            res.max_gap_s = max(res.max_gap_s, now - last)
                        last = now
                        res.text += content
                        res.content_chunks += 1
                        if on_content is not None:
                            maybe = on_content(res)
                            if maybe is not None:
                                await maybe
    return res
