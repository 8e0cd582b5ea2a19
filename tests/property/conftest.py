"""A live stack for property-based tests: the in-loop stack of the integration tests, run on
an event loop in a thread of its own, so that synchronous clients (hypothesis-driven raw
sockets, schemathesis) can call it from the test thread. Real sockets throughout."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from services.edge.guard import GuardConfig
from tests.integration.conftest import Stack, start_stack, stop_stack
from tests.support.builders import edge_config
from tests.support.inproc import start_edge
from tests.support.redis_proc import RedisProcess

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass
class LiveEdge:
    stack: Stack
    port: int
    key: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _start(redis_url: str) -> Stack:
    stack = await start_stack(redis_url, time_scale=0.01)
    await stack.edge.stop()
    stack.edge = await start_edge(
        redis_url=redis_url,
        router_address=stack.router.address,
        config=edge_config(
            guard=GuardConfig(ip_requests_per_s=0, header_timeout_s=5.0, body_timeout_s=5.0),
        ),
    )
    stack.key = await stack.edge.new_key("fuzz")
    return stack


@pytest.fixture(scope="module")
def live_edge(redis_process: RedisProcess) -> Iterator[LiveEdge]:
    redis_process.flush()
    thread = LoopThread()
    stack = thread.run(_start(redis_process.url))
    port = int(stack.edge.url.rsplit(":", 1)[1])
    try:
        yield LiveEdge(stack, port, stack.key)
    finally:
        thread.run(stop_stack(stack))
        thread.close()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    raw_head: bytes


def exchange(port: int, request: bytes, *, timeout_s: float = 15.0) -> Reply:
    """Send raw bytes, read the whole answer (the request asks to close); a hang fails."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no complete answer within {timeout_s}s") from None
            except ConnectionResetError:
                break
            if not data:
                break
            chunks.append(data)
    raw = b"".join(chunks)
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"not an HTTP answer: {raw[:200]!r}"
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = _dechunk(body)
    return Reply(status, headers, body, head)


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return bytes(out)


def http_request(
    method: str,
    path: str,
    body: bytes = b"",
    *,
    headers: dict[str, str] | None = None,
    raw_headers: bytes = b"",
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join(lines).encode("latin-1") + b"\r\n" + raw_headers + b"\r\n" + body
