"""The drain deadline of a real edge process (``python -m services.edge``) on SIGTERM, in
front of the in-loop router and simulated workers and a real Redis.

Within ``--drain-grace-s`` live streams go on, and one that ends inside it ends as usual. At
the deadline whatever still runs is ended by the edge itself, not left to aiohttp (which
waited a second grace and then dropped the connection without a word): a stream gets one
OpenAI-style error event, then ``[DONE]``; a non-streamed request a 503; both cancel their
worker's generation and settle their usage. One log line counts them, and the process exits
within the grace and a moment — never twice the grace.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from services.common.net import free_port
from services.edge.tenancy.tenants import Limits
from tests.integration.conftest import MODEL, Stack
from tests.support.builders import edge_config
from tests.support.inproc import TEST_PEPPER, start_edge
from tests.support.wait import eventually

GRACE_S = 2.0
#: How long past the grace the process may take to exit.
EXIT_MARGIN_S = 2.0
#: Far more than the sim generates within the grace (about 800 tokens a second).
LONG_TOKENS = 6000

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


def running(stack: Stack) -> int:
    return sum(w.engine.load().running for w in stack.workers.values())


def log_events(stderr: str, name: str) -> list[dict[str, Any]]:
    out = []
    for line in stderr.splitlines():
        if line.startswith("{") and f'"event":"{name}"' in line:
            out.append(json.loads(line))
    return out


async def test_sigterm_ends_what_outlives_the_grace_with_an_error_event_then_exits(
    stack: Stack, redis_url: str, tmp_path: Path
) -> None:
    key = await stack.edge.new_key("metered", limits=Limits(tpm=10_000_000, max_streams=10))
    headers = {"Authorization": f"Bearer {key}"}
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
        str(GRACE_S),
        env={**os.environ, "MERIDIAN_KEY_PEPPER": TEST_PEPPER.decode()},
        stderr=asyncio.subprocess.PIPE,
    )
    loop = asyncio.get_running_loop()
    try:
        await eventually(lambda: ready.exists() or proc.returncode is not None, timeout_s=30.0)
        assert proc.returncode is None, "the edge did not start"
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        async with aiohttp.ClientSession() as http:
            whole = asyncio.create_task(
                http.post(
                    url, headers=headers, json={**LONG, "stream": False, "max_tokens": LONG_TOKENS}
                )
            )
            long = await http.post(url, headers=headers, json={**LONG, "max_tokens": LONG_TOKENS})
            assert long.status == 200
            request_id = long.headers["x-request-id"]
            await long.content.readuntil(b"\n\n")
            await eventually(lambda: running(stack) >= 2, timeout_s=5.0)
            short = await http.post(url, headers=headers, json={**LONG, "max_tokens": 200})
            assert short.status == 200
            await short.content.readuntil(b"\n\n")

            sent_at = loop.time()
            proc.send_signal(signal.SIGTERM)
            short_frames = await asyncio.wait_for(read_sse(short), GRACE_S)
            long_frames = await asyncio.wait_for(read_sse(long), GRACE_S + EXIT_MARGIN_S)
            long_ended_s = loop.time() - sent_at
            async with await asyncio.wait_for(whole, EXIT_MARGIN_S) as answer:
                status, retry_after = answer.status, answer.headers.get("Retry-After")
                body = await answer.json()
        assert await asyncio.wait_for(proc.wait(), GRACE_S + EXIT_MARGIN_S + 5.0) == 0
        exited_s = loop.time() - sent_at
        assert proc.stderr is not None
        stderr = (await proc.stderr.read()).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    # A stream that ends inside the grace ends normally.
    assert short_frames[-1] == "[DONE]"
    assert json.loads(short_frames[-2])["choices"][0]["finish_reason"] == "length"
    assert not any('"error"' in f for f in short_frames)

    # The stream still running at the deadline ran for the grace, then got one error event
    # (the edge's mid-stream error format) and [DONE].
    assert GRACE_S - 0.5 <= long_ended_s <= GRACE_S + 1.0, long_ended_s
    assert long_frames[-1] == "[DONE]"
    error = json.loads(long_frames[-2])
    assert set(error) == {"error"}
    assert error["error"]["type"] == "service_unavailable"
    assert error["error"]["code"] == "edge_shutting_down"
    assert "shutting down" in error["error"]["message"]
    assert sum('"error"' in f for f in long_frames) == 1
    assert json.loads(long_frames[-3])["choices"][0]["delta"].get("content")  # tokens before

    # The non-streamed request still running at the deadline: a 503 in OpenAI's format.
    assert status == 503
    assert retry_after == "1"
    assert body["error"]["code"] == "edge_shutting_down"

    # The process exits within the grace and a moment, not twice the grace.
    assert exited_s <= GRACE_S + EXIT_MARGIN_S, exited_s

    # The workers stopped generating (uncut, the long requests would run for seconds more).
    await eventually(lambda: running(stack) == 0, timeout_s=1.0)

    # The cut stream's usage was settled with what it used, and its stream slot freed.
    client = aioredis.Redis.from_url(redis_url)
    try:
        used = int(await client.hget("meridian:rl:{metered}:t:n", request_id) or 0)
        assert 0 < used < LONG_TOKENS
        assert await client.zcard("meridian:rl:{metered}:t:c") == 0
    finally:
        await client.aclose()

    (deadline,) = log_events(stderr, "edge.drain_deadline")
    assert (deadline["streams_cut"], deadline["requests_cut"]) == (1, 1)
    assert deadline["grace_s"] == GRACE_S
    (stopped,) = log_events(stderr, "edge.stopped")
    assert stopped["counters"]["drain_streams_cut"] == 1
    assert stopped["counters"]["drain_requests_cut"] == 1
    assert not log_events(stderr, "edge.drain_forced")


async def test_a_completions_stream_left_at_the_deadline_is_cut_the_same_way(
    stack: Stack, redis_url: str
) -> None:
    """In process, so the edge's own counts can be read: a /v1/completions stream of two
    prompts (one worker call each) gets the one error event and [DONE], both calls are
    cancelled, the lease is settled, and ``stop`` returns within the grace and a moment."""
    grace_s = 0.5
    edge = await start_edge(
        redis_url=redis_url,
        router_address=stack.router.address,
        config=edge_config(drain_grace_s=grace_s),
    )
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            f"{edge.url}/v1/completions",
            headers={"Authorization": f"Bearer {stack.key}"},
            json={
                "model": MODEL,
                "prompt": ["go on", "and on"],
                "stream": True,
                "ignore_eos": True,
                "max_tokens": LONG_TOKENS,
            },
        )
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")
        await eventually(lambda: running(stack) == 2, timeout_s=5.0)
        started = loop.time()
        stopping = asyncio.create_task(edge.stop())
        frames = await asyncio.wait_for(read_sse(resp), grace_s + EXIT_MARGIN_S)
        await asyncio.wait_for(stopping, EXIT_MARGIN_S)
        stopped_s = loop.time() - started
    assert frames[-1] == "[DONE]"
    assert json.loads(frames[-2])["error"]["code"] == "edge_shutting_down"
    assert json.loads(frames[-3])["object"] == "text_completion"
    assert grace_s - 0.2 <= stopped_s <= grace_s + 1.0, stopped_s
    assert edge.counters.drain_streams_cut == 1
    assert edge.counters.drain_requests_cut == 0
    assert edge.server.limiter.live_leases == 0
    await eventually(lambda: running(stack) == 0, timeout_s=1.0)


async def test_idle_connections_close_when_the_drain_begins_not_at_its_end(
    stack: Stack, redis_url: str
) -> None:
    """aiohttp's pre_shutdown only stops reading a kept-alive connection with no request
    running (an SDK's pooled connection) and leaves it open: a request sent on it during the
    drain got no answer for the whole grace, then a bare close. Such a connection now closes
    when the drain begins (its client retries elsewhere at once), and one whose next request
    had begun to arrive gets a 503 in the API's format first."""
    grace_s = 3.0
    edge = await start_edge(
        redis_url=redis_url,
        router_address=stack.router.address,
        config=edge_config(drain_grace_s=grace_s),
    )
    host, port = edge.url.removeprefix("http://").rsplit(":", 1)
    loop = asyncio.get_running_loop()
    pooled_r, pooled_w = await asyncio.open_connection(host, int(port))
    partial_r, partial_w = await asyncio.open_connection(host, int(port))
    async with aiohttp.ClientSession() as http:
        try:
            pooled_w.write(b"GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n")
            head = await asyncio.wait_for(pooled_r.readuntil(b"\r\n\r\n"), 5.0)
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await pooled_r.readexactly(length)  # now idle, kept alive
            partial_w.write(b"GET /healthz HTTP/1.1\r\nHost: edge\r\n")  # headers not done
            await partial_w.drain()

            # A live stream holds the drain open for the whole grace.
            resp = await http.post(
                f"{edge.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {stack.key}"},
                json={**LONG, "max_tokens": LONG_TOKENS},
            )
            assert resp.status == 200
            await resp.content.readuntil(b"\n\n")
            started = loop.time()
            stopping = asyncio.create_task(edge.stop())

            assert await asyncio.wait_for(pooled_r.read(), 1.0) == b""  # closed, at once
            answer = await asyncio.wait_for(partial_r.read(), 1.0 + 1.5)  # + the linger
            assert loop.time() - started < grace_s - 0.5
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 "), answer
            assert json.loads(body)["error"]["type"] == "service_unavailable"
            assert "shutting down" in json.loads(body)["error"]["message"]

            # The live stream still gets its grace, then the deadline's error event.
            frames = await asyncio.wait_for(read_sse(resp), grace_s + EXIT_MARGIN_S)
            assert loop.time() - started >= grace_s - 0.2
            assert json.loads(frames[-2])["error"]["code"] == "edge_shutting_down"
            await asyncio.wait_for(stopping, EXIT_MARGIN_S)
        finally:
            for w in (pooled_w, partial_w):
                w.close()
    await eventually(lambda: running(stack) == 0, timeout_s=1.0)
