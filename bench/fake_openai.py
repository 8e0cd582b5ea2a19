"""A fake OpenAI-compatible backend for the proxy benchmarks: fast, deterministic, cheap.

    .venv/bin/python -m bench.fake_openai --port 8000 [--ttft-ms 20] [--itl-ms 10] [--tokens 64]

Streaming chat completions (and non-streaming ones) whose first token comes ``--ttft-ms``
after the request, then one token every ``--itl-ms``, ``--tokens`` in all (a request's
``max_tokens`` lowers it), then the finish chunk, the usage chunk when
``stream_options.include_usage`` is set, and ``[DONE]``. Also ``GET /v1/models``,
``GET /health`` and ``GET /metrics`` (404: not vLLM). HTTP/1.1 keep-alive, chunked.

A raw ``asyncio.Protocol`` on uvloop with every SSE frame rendered once per model, and one
timer per token on an ideal timeline (lateness does not accumulate): so the backend's own CPU
per token stays small next to any proxy's, and the same for every proxy in front of it.
Written for this benchmark; not a general HTTP server (no pipelining beyond one request in
flight per connection, bodies by Content-Length only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path

from services.common import cli

MAX_BODY = 1024 * 1024


class Frames:
    """Every byte string one model's stream needs, built once."""

    def __init__(self, model: str, tokens: int) -> None:
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0}
        base["model"] = model

        def chunk(obj: dict[str, object]) -> bytes:
            data = b"data: " + json.dumps({**base, **obj}, separators=(",", ":")).encode() + b"\n\n"
            return b"%x\r\n%s\r\n" % (len(data), data)

        self.role = chunk(
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        )
        self.token = chunk(
            {"choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": None}]}
        )
        self.finish = {
            r: chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": r}]})
            for r in ("stop", "length")
        }
        self.usage = {
            n: chunk(
                {
                    "choices": [],
                    "usage": {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n},
                }
            )
            for n in range(tokens + 1)
        }
        self.done = chunk_bytes(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def chunk_bytes(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def response(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class FakeBackend(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None
        self.streaming = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while not self.streaming:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if length > MAX_BODY:
                self._send(response("413 Payload Too Large", b"{}"))
                return
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            self.handle(method, path.split("?")[0], body)

    def _send(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def handle(self, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path in ("/v1/models", "/models"):
            models = [{"id": self.server.model, "object": "model", "owned_by": "bench"}]
            self._send(response("200 OK", json.dumps({"object": "list", "data": models}).encode()))
        elif method == "GET" and path in ("/health", "/healthz", "/health_generate"):
            self._send(response("200 OK", b"{}"))
        elif method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            self.chat(body)
        else:
            self._send(response("404 Not Found", b'{"error":{"message":"not found"}}'))

    def chat(self, body: bytes) -> None:
        try:
            req = json.loads(body)
        except ValueError:
            self._send(response("400 Bad Request", b'{"error":{"message":"bad json"}}'))
            return
        n = self.server.tokens
        max_tokens = req.get("max_tokens") or req.get("max_completion_tokens")
        if isinstance(max_tokens, int) and 0 < max_tokens < n:
            n = max_tokens
        reason = "length" if n < self.server.tokens else "stop"
        frames = self.server.frames(str(req.get("model", self.server.model)))
        if not req.get("stream"):
            text = " tok" * n
            payload = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 0,
                "model": req.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": reason,
                    }
                ],
                "usage": {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n},
            }
            loop = asyncio.get_running_loop()
            delay = (self.server.ttft_s + self.server.itl_s * (n - 1)) if n else 0.0
            self.timer = loop.call_later(
                delay, self._send, response("200 OK", json.dumps(payload).encode())
            )
            return
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        self.streaming = True
        self._send(SSE_HEAD + frames.role)
        loop = asyncio.get_running_loop()
        start = loop.time()
        state = {"sent": 0}

        def tick() -> None:
            if self.transport is None:
                return
            state["sent"] += 1
            if state["sent"] < n:
                self.transport.write(frames.token)
                self.timer = loop.call_at(
                    start + self.server.ttft_s + self.server.itl_s * state["sent"], tick
                )
                return
            tail = frames.token + frames.finish[reason]
            if usage:
                tail += frames.usage[n]
            self.transport.write(tail + frames.done)
            self.timer = None
            self.streaming = False
            if self.buffer:
                self.data_received(b"")

        self.timer = loop.call_at(start + self.server.ttft_s, tick)


class Server:
    def __init__(self, *, model: str, tokens: int, ttft_ms: float, itl_ms: float) -> None:
        self.model = model
        self.tokens = tokens
        self.ttft_s = ttft_ms / 1000
        self.itl_s = itl_ms / 1000
        self._frames: dict[str, Frames] = {}

    def frames(self, model: str) -> Frames:
        f = self._frames.get(model[:256])
        if f is None:
            f = self._frames[model[:256]] = Frames(model[:256], self.tokens)
        return f


def _write_ready(path: Path, port: int) -> None:
    path.write_text(json.dumps({"port": port}))


async def serve(args: argparse.Namespace) -> None:
    server = Server(model=args.model, tokens=args.tokens, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(
        lambda: FakeBackend(server), args.host, args.port, backlog=4096, reuse_address=True
    )
    port = srv.sockets[0].getsockname()[1]
    if args.ready_file:
        _write_ready(Path(args.ready_file), port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    srv.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=cli.integer(0, 65535), default=0)
    p.add_argument("--ready-file")
    p.add_argument("--model", default="fake-model")
    p.add_argument("--tokens", type=cli.positive_int, default=64)
    p.add_argument("--ttft-ms", type=cli.non_negative_float, default=20.0)
    p.add_argument("--itl-ms", type=cli.non_negative_float, default=10.0)
    p.add_argument("--log-level", default="warning")  # accepted for ManagedProcess-style launch
    args = p.parse_args(argv)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
