"""Connection-level limits on a real listening socket, driven with raw bytes: slow-loris
headers, header size and count, malformed requests, connection caps, the per-IP request rate
and idle connections. Every refusal is an OpenAI-style JSON error and is counted."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from aiohttp import web

from services.common.clock import SYSTEM_CLOCK
from services.edge.counters import EdgeCounters
from services.edge.guard import GuardConfig, IpBuckets, Occupancy
from services.edge.middleware.error_boundary import error_boundary
from services.edge.middleware.ip_guard import ip_guard
from services.edge.protocol import Listener
from tests.support.wait import eventually

GET = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"


@dataclass
class Served:
    port: int
    counters: EdgeCounters
    connections: Occupancy


@asynccontextmanager
async def serve(**guard: float) -> AsyncIterator[Served]:
    config = GuardConfig(**{"header_timeout_s": 0.3, **guard})  # type: ignore[arg-type]
    counters = EdgeCounters()
    connections = Occupancy(
        max_total=config.max_connections, max_per_ip=config.max_connections_per_ip
    )
    buckets = IpBuckets(rate=config.ip_requests_per_s, burst=config.ip_burst, clock=SYSTEM_CLOCK)

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application(
        middlewares=[error_boundary, ip_guard(buckets=buckets, counters=counters)]
    )
    app.router.add_get("/ok", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    assert runner.server is not None
    listener = Listener(
        server=runner.server,
        host="127.0.0.1",
        port=0,
        ssl_context=None,
        config=config,
        connections=connections,
        counters=counters,
    )
    port = await listener.start()
    try:
        yield Served(port, counters, connections)
    finally:
        listener.close()
        await runner.cleanup()


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@asynccontextmanager
async def connect(port: int) -> AsyncIterator[Stream]:
    """A raw connection to ``port``, closed on the way out however the test ends."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        await close_writer(writer)


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):  # the server may already have reset it
        await writer.wait_closed()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5.0)
    return status, headers, body


def openai_error(body: bytes) -> dict[str, object]:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return dict(err)


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), 5.0) == b""


async def test_slow_headers_get_408_however_the_bytes_trickle() -> None:
    async with serve() as s, connect(s.port) as (reader, writer):
        writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n")

        async def trickle() -> None:
            for _ in range(100):
                writer.write(b"X-Slow: 1\r\n")
                await asyncio.sleep(0.02)

        dripping = asyncio.create_task(trickle())
        try:
            status, headers, body = await read_response(reader)
        finally:
            dripping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dripping
        assert status == 408
        assert headers["connection"] == "close"
        assert openai_error(body)["code"] == "request_timeout"
        assert s.counters.header_timeouts == 1


async def test_a_silent_connection_is_closed_at_the_header_deadline() -> None:
    async with serve() as s, connect(s.port) as (reader, _):
        status, _, _ = await read_response(reader)
        assert status == 408
        assert await closed(reader)


async def test_the_deadline_applies_again_to_the_next_request_on_a_kept_connection() -> None:
    async with serve() as s, connect(s.port) as (reader, writer):
        writer.write(GET)
        assert (await read_response(reader))[0] == 200
        await asyncio.sleep(0.5)  # idle between requests is fine (idle timeout is longer)
        writer.write(b"GET /ok HTTP/1.1\r\n")  # ... but a started request must complete
        assert (await read_response(reader))[0] == 408


async def send(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    async with connect(port) as (reader, writer):
        writer.write(data)
        return await read_response(reader)


async def test_too_many_headers_are_431() -> None:
    async with serve(max_headers=8) as s:
        extra = b"".join(b"X-%d: 1\r\n" % i for i in range(20))
        status, _, body = await send(s.port, b"GET /ok HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
        assert status == 431
        assert openai_error(body)["code"] == "headers_too_large"
        assert s.counters.headers_too_large == 1


async def test_a_header_line_over_the_limit_is_431() -> None:
    async with serve(max_header_bytes=1024) as s:
        big = b"X-Big: " + b"a" * 4000 + b"\r\n"
        status, _, _ = await send(s.port, b"GET /ok HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
        assert status == 431
        assert s.counters.headers_too_large == 1


@pytest.mark.parametrize("target", [b"/v1/models?q=" + b"a" * 4000, b"http://x/" + b"a" * 4000])
async def test_a_request_target_over_the_limit_is_414(target: bytes) -> None:
    async with serve(max_header_bytes=1024) as s:
        status, _, body = await send(s.port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 414
        assert openai_error(body)["code"] == "uri_too_long"


async def test_malformed_requests_are_400_in_json_without_a_trace() -> None:
    async with serve() as s:
        for garbage in (b"HELLO\r\n\r\n", b"GET /ok HTTP/1.1\r\nBad Header\r\n\r\n"):
            status, headers, body = await send(s.port, garbage)
            assert status == 400
            assert headers["content-type"].startswith("application/json")
            err = openai_error(body)
            assert err["type"] == "invalid_request_error"
            assert "Traceback" not in str(err["message"])
        assert s.counters.bad_http_requests == 2


async def hold(port: int) -> Callable[[], Awaitable[None]]:
    """An open connection that sends nothing yet; returns a closer."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)

    async def close() -> None:
        await close_writer(writer)

    return close


async def test_connections_over_the_per_ip_cap_are_answered_429_and_closed() -> None:
    async with serve(max_connections_per_ip=2, header_timeout_s=5.0) as s:
        held = [await hold(s.port) for _ in range(2)]
        try:
            await eventually(lambda: s.connections.total >= 2)
            async with connect(s.port) as (reader, writer):
                writer.write(GET)
                status, headers, body = await read_response(reader)
                assert status == 429
                assert headers["retry-after"] == "1"
                assert "connections" in str(openai_error(body)["message"])
                assert await closed(reader)
            assert s.counters.connections_refused_ip == 1
            await held[0]()
            await eventually(lambda: s.connections.total <= 1)
            assert (await send(s.port, GET))[0] == 200
        finally:
            for close in held:
                await close()


async def test_connections_over_the_edge_cap_are_answered_503() -> None:
    async with serve(max_connections=1, header_timeout_s=5.0) as s:
        close = await hold(s.port)
        try:
            await eventually(lambda: s.connections.total >= 1)
            status, _, body = await send(s.port, GET)
            assert status == 503
            assert openai_error(body)["type"] == "overloaded_error"
            assert s.counters.connections_refused_edge == 1
        finally:
            await close()


async def test_requests_over_the_per_ip_rate_are_429_with_retry_after() -> None:
    async with serve(ip_requests_per_s=0.5, ip_burst=2) as s:
        assert [(await send(s.port, GET))[0] for _ in range(2)] == [200, 200]
        status, headers, _ = await send(s.port, GET)
        assert status == 429
        assert int(headers["retry-after"]) >= 1
        assert s.counters.ip_rate_limited == 1


async def test_idle_kept_alive_connections_are_closed() -> None:
    async with serve(idle_timeout_s=0.3, header_timeout_s=5.0) as s:
        async with connect(s.port) as (reader, writer):
            writer.write(GET)
            assert (await read_response(reader))[0] == 200
            assert await closed(reader)
        assert s.connections.total == 0
