"""DelayProxy over real sockets on 127.0.0.1, in front of small real asyncio servers.

Timing assertions are lower bounds (the delay is a floor the proxy must respect) plus upper
bounds a full second or more above the expected figure, so a busy 2-core box cannot flake them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from services.common.errors import InvalidRequest
from services.netem.config import LinkProfile, Route
from services.netem.proxy import CutMode, DelayProxy

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

SILENCE_S = 0.4  # how long "no data comes back" is watched for
CLEAN_LINK = LinkProfile()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo every byte; answer the client's half-close with our own, then close."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.write_eof()
    except OSError:
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def upstream(handler: Handler = echo) -> AsyncIterator[int]:
    """Serve ``handler`` on a free port; on exit, end every connection it still has (Python
    3.11's ``Server.wait_closed`` does not wait for them)."""
    live: dict[asyncio.StreamWriter, asyncio.Future[None]] = {}

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        live[writer] = asyncio.get_running_loop().create_future()
        try:
            await handler(reader, writer)
        finally:
            writer.close()
            live.pop(writer).set_result(None)

    server = await asyncio.start_server(tracked, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in list(live):
            writer.transport.abort()  # the handler's next read ends; it returns normally
        await asyncio.gather(*live.values())
        await server.wait_closed()


@contextlib.asynccontextmanager
async def proxied(
    link: LinkProfile = CLEAN_LINK, handler: Handler = echo, **proxy_kwargs: int
) -> AsyncIterator[DelayProxy]:
    async with upstream(handler) as port:
        route = Route(name="test", upstream_host="127.0.0.1", upstream_port=port, link=link)
        async with DelayProxy(route, **proxy_kwargs) as proxy:
            yield proxy


async def connect(proxy: DelayProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(proxy.host, proxy.port)


async def round_trip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes = b"ping"
) -> float:
    start = time.monotonic()
    writer.write(payload)
    await writer.drain()
    got = await asyncio.wait_for(reader.readexactly(len(payload)), 10)
    assert got == payload
    return time.monotonic() - start


async def connection_ends(reader: asyncio.StreamReader, within_s: float = 5) -> bool:
    """True when the peer closed or reset the connection (EOF or a reset error)."""
    try:
        data = await asyncio.wait_for(reader.read(65536), within_s)
    except ConnectionError:
        return True
    return data == b""


async def stays_silent(reader: asyncio.StreamReader) -> bool:
    """True when nothing at all (no data, no EOF, no reset) arrives for SILENCE_S."""
    try:
        await asyncio.wait_for(reader.read(1), SILENCE_S)
    except TimeoutError:
        return True
    except ConnectionError:
        return False
    return False


def abort_with_rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# -- delivery -------------------------------------------------------------------------------


async def test_forwards_a_large_transfer_byte_for_byte_on_a_clean_link() -> None:
    payload = os.urandom(2 * 1024 * 1024)
    async with proxied() as proxy:
        reader, writer = await connect(proxy)
        writer.write(payload)
        writer.write_eof()
        got = await asyncio.wait_for(reader.read(), 30)
        writer.close()
    assert got == payload


async def test_round_trip_grows_by_twice_the_one_way_delay() -> None:
    delay_s = 0.06
    async with proxied(LinkProfile(delay_ms=delay_s * 1000)) as proxy:
        reader, writer = await connect(proxy)
        rtts = [await round_trip(reader, writer) for _ in range(3)]
        writer.close()
    assert min(rtts) >= 2 * delay_s
    assert min(rtts) < 2 * delay_s + 1.0


async def test_set_delay_changes_the_round_trip_of_a_live_connection() -> None:
    async with proxied(LinkProfile(delay_ms=0)) as proxy:
        reader, writer = await connect(proxy)
        before = await round_trip(reader, writer)
        proxy.set_delay(100)
        after = await round_trip(reader, writer)
        writer.close()
    assert proxy.link.delay_ms == 100
    assert after >= 0.2
    assert before < after


async def test_jitter_and_stalls_never_reorder_a_large_transfer() -> None:
    payload = os.urandom(4 * 1024 * 1024)
    link = LinkProfile(delay_ms=3, jitter_ms=5, loss=0.2, rto_ms=10, seed=42)
    async with proxied(link) as proxy:
        reader, writer = await connect(proxy)

        async def send() -> None:
            view = memoryview(payload)
            step = 1
            while view:
                # Irregular write sizes, so chunk boundaries and draws vary along the stream.
                writer.write(view[: step * 997])
                view = view[step * 997 :]
                step = step % 61 + 1
                await writer.drain()
            writer.write_eof()

        _, got = await asyncio.wait_for(asyncio.gather(send(), reader.read()), 60)
        writer.close()
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
    assert proxy.stats().stalls > 0  # the stalls really happened along the way


async def test_chunks_in_flight_overlap_so_the_delay_does_not_serialise_throughput() -> None:
    """50 messages, each delayed 50 ms each way: a pipe that held one chunk at a time would
    need 50 x 100 ms = 5 s; overlapping them it needs about one round trip plus the sending."""
    delay_s, messages = 0.05, 50
    async with proxied(LinkProfile(delay_ms=delay_s * 1000)) as proxy:
        reader, writer = await connect(proxy)
        start = time.monotonic()
        for i in range(messages):
            writer.write(b"m%03d" % i)
            await writer.drain()
            await asyncio.sleep(0.002)  # separate chunks, not one coalesced write
        got = await asyncio.wait_for(reader.readexactly(4 * messages), 30)
        elapsed = time.monotonic() - start
        writer.close()
    assert got == b"".join(b"m%03d" % i for i in range(messages))
    assert elapsed >= 2 * delay_s
    assert elapsed < messages * delay_s / 2  # 1.25 s, against 5 s serialised


async def test_loss_shows_up_as_a_retransmission_stall() -> None:
    link = LinkProfile(delay_ms=0, loss=1.0, rto_ms=150)
    async with proxied(link) as proxy:
        reader, writer = await connect(proxy)
        rtt = await round_trip(reader, writer)
        writer.close()
    assert rtt >= 0.3  # one stall each way
    assert proxy.stats().stalls >= 2


async def test_set_loss_turns_stalls_on_for_a_live_connection() -> None:
    async with proxied(LinkProfile(delay_ms=0, rto_ms=150)) as proxy:
        reader, writer = await connect(proxy)
        await round_trip(reader, writer)
        assert proxy.stats().stalls == 0
        proxy.set_loss(1.0)
        rtt = await round_trip(reader, writer)
        writer.close()
    assert rtt >= 0.3
    assert proxy.stats().stalls >= 2


async def test_backpressure_bounds_what_the_proxy_holds_and_loses_nothing() -> None:
    """An upstream that does not read: the sender must block once the kernel buffers and the
    proxy's bounded queue are full (an unbounded proxy would swallow all 256 MiB), and every
    byte still arrives once the upstream reads."""
    block = bytes(range(256)) * 4096  # 1 MiB
    start_reading = asyncio.Event()
    received = asyncio.get_running_loop().create_future()

    async def slow_sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await start_reading.wait()
        total = 0
        while data := await reader.read(1 << 20):
            total += len(data)
        received.set_result(total)
        writer.close()

    async with proxied(handler=slow_sink, max_in_flight_bytes=256 * 1024) as proxy:
        _, writer = await connect(proxy)
        written = 0
        blocked = False
        while written < 256 * len(block):
            writer.write(block)
            written += len(block)
            try:
                await asyncio.wait_for(writer.drain(), 1.0)
            except TimeoutError:
                blocked = True
                break
        start_reading.set()
        await asyncio.wait_for(writer.drain(), 30)
        writer.write_eof()
        total = await asyncio.wait_for(received, 30)
        writer.close()
    assert blocked
    assert total == written


# -- close and half-close ---------------------------------------------------------------


async def test_half_close_propagates_in_each_direction_independently() -> None:
    """The upstream says hello and half-closes; the client sees EOF yet can still send, and
    the upstream sees the client's own half-close after its data."""
    heard = asyncio.get_running_loop().create_future()

    async def greeter(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        writer.write_eof()
        heard.set_result(await reader.read())  # read() returns at EOF
        writer.close()

    async with proxied(LinkProfile(delay_ms=20), handler=greeter) as proxy:
        reader, writer = await connect(proxy)
        assert await asyncio.wait_for(reader.read(), 10) == b"hello"  # then EOF
        writer.write(b"still here")
        writer.write_eof()
        assert await asyncio.wait_for(heard, 10) == b"still here"
        writer.close()


async def test_upstream_close_reaches_the_client() -> None:
    async def closer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with proxied(LinkProfile(delay_ms=10), handler=closer) as proxy:
        reader, writer = await connect(proxy)
        assert await connection_ends(reader)
        writer.close()


async def test_client_reset_reaches_the_upstream() -> None:
    ended = asyncio.get_running_loop().create_future()

    async def watcher(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ended.set_result(await connection_ends(reader, within_s=30))
        writer.close()

    async with proxied(LinkProfile(delay_ms=10), handler=watcher) as proxy:
        _, writer = await connect(proxy)
        await asyncio.sleep(0.05)  # the proxy has connected upstream
        abort_with_rst(writer)
        assert await asyncio.wait_for(ended, 10)


async def test_an_unreachable_upstream_closes_the_client_and_is_counted() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    route = Route(name="dead", upstream_host="127.0.0.1", upstream_port=dead_port)
    async with DelayProxy(route) as proxy:
        reader, writer = await connect(proxy)
        assert await connection_ends(reader)
        writer.close()
        assert proxy.stats().upstream_failures == 1
        assert proxy.stats().connections_total == 0


async def test_close_ends_live_connections() -> None:
    async with proxied(LinkProfile(delay_ms=5)) as proxy:
        reader, writer = await connect(proxy)
        await round_trip(reader, writer)
        await proxy.close()
        assert await connection_ends(reader)
        writer.close()
        assert proxy.stats().connections_active == 0


async def test_close_ends_connections_held_by_a_blackhole() -> None:
    async with proxied() as proxy:
        proxy.cut(CutMode.BLACKHOLE)
        reader, writer = await connect(proxy)
        writer.write(b"held")
        assert await stays_silent(reader)
        await proxy.close()
        assert await connection_ends(reader)
        writer.close()
        assert proxy.stats().connections_total == 0  # never forwarded


# -- counters -----------------------------------------------------------------------------


async def test_counts_connections_and_delivered_bytes_each_way() -> None:
    async with proxied(LinkProfile(delay_ms=1)) as proxy:
        first = await connect(proxy)
        second = await connect(proxy)
        await round_trip(*first, b"a" * 1000)
        await round_trip(*second, b"b" * 500)
        stats = proxy.stats()
        assert stats.connections_total == 2
        assert stats.connections_active == 2
        assert (stats.bytes_up, stats.bytes_down) == (1500, 1500)
        for reader, writer in (first, second):
            writer.write_eof()
            assert await connection_ends(reader)
            writer.close()
        for _ in range(100):  # the proxy closes its side right after the EOFs
            if proxy.stats().connections_active == 0:
                break
            await asyncio.sleep(0.02)
        assert proxy.stats().connections_active == 0


# -- cuts -----------------------------------------------------------------------------------


async def test_refuse_cut_resets_existing_connections_and_refuses_new_ones() -> None:
    async with proxied(LinkProfile(delay_ms=5)) as proxy:
        reader, writer = await connect(proxy)
        await round_trip(reader, writer)
        proxy.cut(CutMode.REFUSE)
        mode_while_cut = proxy.cut_mode
        assert await connection_ends(reader)
        writer.close()

        new_reader, new_writer = await connect(proxy)
        assert await connection_ends(new_reader)
        new_writer.close()
        assert proxy.stats().connections_refused == 1

        proxy.restore()
        assert (mode_while_cut, proxy.cut_mode) == (CutMode.REFUSE, None)
        healed = await connect(proxy)
        await round_trip(*healed)
        healed[1].close()


async def test_blackhole_cut_accepts_but_never_answers_until_restored() -> None:
    async with proxied(LinkProfile(delay_ms=5)) as proxy:
        existing_reader, existing_writer = await connect(proxy)
        await round_trip(existing_reader, existing_writer)
        proxy.cut("blackhole")
        assert await connection_ends(existing_reader)  # existing: reset
        existing_writer.close()

        reader, writer = await connect(proxy)  # the connect itself succeeds
        writer.write(b"anyone?")
        await writer.drain()
        assert await stays_silent(reader)
        assert proxy.stats().connections_blackholed == 1

        proxy.restore()  # the held connection gets through, like a retransmitted SYN
        assert await asyncio.wait_for(reader.readexactly(7), 10) == b"anyone?"
        writer.close()


async def test_blackhole_without_reset_freezes_live_connections_until_restored() -> None:
    async with proxied(LinkProfile(delay_ms=5)) as proxy:
        reader, writer = await connect(proxy)
        await round_trip(reader, writer)
        proxy.cut(CutMode.BLACKHOLE, reset_existing=False)
        writer.write(b"frozen")
        await writer.drain()
        assert await stays_silent(reader)
        proxy.restore()
        assert await asyncio.wait_for(reader.readexactly(6), 10) == b"frozen"
        await round_trip(reader, writer)
        writer.close()


@pytest.mark.parametrize(
    ("mode", "reset_existing", "param"),
    [("partition", True, "mode"), (CutMode.REFUSE, False, "reset_existing")],
)
async def test_cut_rejects_modes_it_cannot_emulate(
    mode: str, reset_existing: bool, param: str
) -> None:
    async with proxied() as proxy:
        with pytest.raises(InvalidRequest) as caught:
            proxy.cut(mode, reset_existing=reset_existing)
        assert caught.value.param == param
        assert proxy.cut_mode is None


async def test_bad_runtime_link_values_are_rejected_and_leave_the_link_alone() -> None:
    async with proxied(LinkProfile(delay_ms=7, loss=0.1)) as proxy:
        with pytest.raises(InvalidRequest):
            proxy.set_delay(-1)
        with pytest.raises(InvalidRequest):
            proxy.set_loss(2)
        assert proxy.link == LinkProfile(delay_ms=7, loss=0.1)


async def test_listening_on_port_zero_reports_the_bound_port() -> None:
    async with proxied() as proxy:
        assert proxy.route.listen_port == 0
        assert proxy.port > 0
        assert proxy.address == ("127.0.0.1", proxy.port)
