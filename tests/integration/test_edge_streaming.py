"""Streaming done right: a client that goes away cancels the worker call and settles its
limits; a draining edge (in process, and a real process on SIGTERM) stops accepting, lets live
streams finish, then exits."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from services.common.net import free_port
from services.edge.tenancy.tenants import Limits
from tests.integration.conftest import MODEL, Stack
from tests.support.inproc import TEST_PEPPER, start_edge
from tests.support.wait import eventually

LONG = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "go on"}],
    "stream": True,
    "ignore_eos": True,
}


async def read_sse(resp: aiohttp.ClientResponse) -> list[str]:
    frames = []
    async for line in resp.content:
        text = line.decode().strip()
        if text.startswith("data: "):
            frames.append(text[6:])
    return frames


async def test_a_disconnect_cancels_the_worker_and_settles_tokens_and_slot(
    stack: Stack, redis_url: str
) -> None:
    key = await stack.edge.new_key("metered", limits=Limits(tpm=1_000_000, max_streams=1))
    kr = stack.workers["kr-1"]
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            f"{stack.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={**LONG, "max_tokens": 5000},
        )
        request_id = resp.headers["x-request-id"]
        reserved = 1_000_000 - int(resp.headers["x-ratelimit-remaining-tokens"])
        for _ in range(5):
            await resp.content.readuntil(b"\n\n")
        resp.close()
    await eventually(lambda: kr.engine.load().running == 0, timeout_s=3.0)
    await eventually(lambda: stack.edge.server.limiter.live_leases == 0, timeout_s=3.0)
    client = aioredis.Redis.from_url(redis_url)
    for _ in range(100):
        used = int(await client.hget("meridian:rl:{metered}:t:n", request_id) or 0)
        if used < reserved:
            break
        await asyncio.sleep(0.02)
    assert 0 < used < reserved  # the tokens generated before the client left, not 5000 more
    assert await client.zcard("meridian:rl:{metered}:t:c") == 0  # the slot is free
    await client.aclose()
    assert stack.edge.counters.client_disconnects >= 1


async def test_draining_finishes_live_streams_and_refuses_new_connections(
    stack: Stack, redis_url: str
) -> None:
    edge = await start_edge(redis_url=redis_url, router_address=stack.router.address)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            f"{edge.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {stack.key}"},
            json={**LONG, "max_tokens": 1200},
        )
        await resp.content.readuntil(b"\n\n")
        stopping = asyncio.create_task(edge.stop())
        await eventually(lambda: edge.deps.lifecycle.draining)
        with pytest.raises(aiohttp.ClientConnectionError):
            async with aiohttp.ClientSession() as other, other.get(f"{edge.url}/healthz"):
                pass
        frames = await read_sse(resp)
        await stopping
    assert frames[-1] == "[DONE]"
    assert json.loads(frames[-2])["choices"][0]["finish_reason"] == "length"


async def test_sigterm_drains_a_real_edge_process(
    stack: Stack, redis_url: str, tmp_path: Path
) -> None:
    ready = tmp_path / "edge.ready"
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.edge",
        "--plain-http",
        "--port",
        str(port),
        "--redis-url",
        redis_url,
        "--router",
        stack.router.address,
        "--ready-file",
        str(ready),
        "--drain-grace-s",
        "20",
        env={**os.environ, "MERIDIAN_KEY_PEPPER": TEST_PEPPER.decode()},
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await eventually(ready.exists, timeout_s=20.0)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        async with aiohttp.ClientSession() as http:
            resp = await http.post(
                url,
                headers={"Authorization": f"Bearer {stack.key}"},
                json={**LONG, "max_tokens": 1500},
            )
            assert resp.status == 200
            await resp.content.readuntil(b"\n\n")
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            with pytest.raises(aiohttp.ClientConnectionError):
                async with aiohttp.ClientSession() as other, other.get(f"{url}"):
                    pass
            frames = await read_sse(resp)
        assert frames[-1] == "[DONE]"
        assert await asyncio.wait_for(proc.wait(), 20.0) == 0
        assert proc.stderr is not None
        log = (await proc.stderr.read()).decode()
        assert '"event":"edge.draining"' in log
        assert '"event":"edge.stopped"' in log
        assert stack.key not in log
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def dechunk(raw: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 response (``raw``: everything after the headers)."""
    body = bytearray()
    while raw:
        size_line, _, raw = raw.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body += raw[:size]
        raw = raw[size + 2 :]
    return bytes(body)


def assemble(sse: bytes) -> tuple[str, list[str], dict[str, int], int]:
    """(text, one logprob token per generated token, usage, content events) of an SSE body."""
    text, tokens, usage, events = [], [], {}, 0
    for frame in sse.decode().split("\n\n"):
        if not frame.startswith("data: ") or frame == "data: [DONE]":
            continue
        payload = json.loads(frame[6:])
        if payload.get("usage"):
            usage = payload["usage"]
        for choice in payload["choices"]:
            piece = choice["delta"].get("content")
            if piece:
                events += 1
                text.append(piece)
            if choice.get("logprobs"):
                tokens += [lp["token"] for lp in choice["logprobs"]["content"]]
    return "".join(text), tokens, usage, events


async def test_a_slow_reading_client_gets_every_token_in_order_when_chunks_are_merged(
    stack: Stack,
) -> None:
    """A client that stops reading while the model writes fills its socket; the edge then
    holds what arrives and sends it as fewer, fuller events when the client reads again. What
    the client assembles — text, one logprob per token, usage — is what a client that kept
    up gets for the same seeded request."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "a long one"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 3000,
        "ignore_eos": True,
        "seed": 11,
        "logprobs": True,
        "top_logprobs": 20,  # large events: past what the kernel buffers take
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {stack.key}"},
            json=body,
        ) as resp,
    ):
        assert resp.status == 200
        reference = assemble(await resp.read())
    assert stack.edge.counters.merged_events == 0  # a client that keeps up: nothing merged

    port = int(stack.edge.url.rsplit(":", 1)[1])
    payload = json.dumps(body).encode()
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(
        sock,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {stack.key}\r\nContent-Length: {len(payload)}\r\n".encode()
        + b"Connection: close\r\n\r\n"
        + payload,
    )
    raw = bytearray()
    try:
        # Not reading while the worker writes: the socket fills and the edge holds chunks.
        await eventually(lambda: stack.edge.counters.chunks_merged >= 20, timeout_s=20.0)
        while not raw.endswith(b"0\r\n\r\n"):
            data = await loop.sock_recv(sock, 65536)
            if not data:
                break
            raw += data
    finally:
        sock.close()
    head, _, rest = bytes(raw).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    got = assemble(dechunk(rest))
    text, tokens, usage, events = got
    assert usage == reference[2]
    assert usage["completion_tokens"] == 3000
    assert text == reference[0]
    assert tokens == reference[1]  # every token's logprob, in order
    assert len(tokens) == 3000
    assert events < reference[3]  # fewer, fuller events
    assert stack.edge.counters.merged_events >= 1
