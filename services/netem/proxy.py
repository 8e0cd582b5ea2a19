"""``DelayProxy``: a TCP proxy that puts an emulated network link in front of one upstream.

The kernel on our machines has no netem, so distance is emulated in userspace: every accepted
connection is forwarded to the upstream through two :class:`~services.netem.pipe.Pipe`\\s (one
per direction), each delaying its bytes by the route's one-way delay. A request/response
exchange therefore costs ``2 * delay_ms`` more, which is what the router measures as RTT.

Runtime controls, for tests and for demos of failure:

- ``set_link`` / ``set_delay`` / ``set_loss``: change the link; applies to bytes read after.
- ``cut(CutMode.REFUSE)``: reset every current connection; new connections are accepted and
  reset at once (the client sees a connection reset, as from a dead host's RST).
- ``cut(CutMode.BLACKHOLE)``: reset every current connection (or, with
  ``reset_existing=False``, freeze them: nothing more is delivered, like a silent partition
  that only keepalives can detect); new connections are accepted and held without being
  forwarded. ``restore()`` lets held connections through, the way a SYN retransmitted after a
  partition heals finally gets its answer.
- ``restore()``: back to normal.

Not modelled: the extra round trip of the TCP handshake (the client's connect completes
locally; the upstream connect is made at once), bandwidth limits, and the delay of a reset
(a source reset reaches the other side at once, dropping bytes in flight).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import itertools
import logging
import socket
import struct
from dataclasses import dataclass

from services.common.errors import InvalidRequest
from services.common.logs import event
from services.netem.config import LinkProfile, Route
from services.netem.link import LinkSchedule
from services.netem.pipe import Pipe, PipeEnd

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT_BYTES = 4 * 1024 * 1024
"""Per direction and connection: 4 MiB over a 100 ms one-way delay still carries ~40 MB/s."""

_CLOSE_GRACE_S = 2.0


class CutMode(enum.StrEnum):
    REFUSE = "refuse"
    BLACKHOLE = "blackhole"


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Counters since start. ``bytes_up`` is client → upstream, ``bytes_down`` the reverse,
    counted when delivered; ``stalls`` counts emulated losses (retransmission stalls)."""

    connections_total: int
    connections_active: int
    connections_refused: int
    connections_blackholed: int
    upstream_failures: int
    bytes_up: int
    bytes_down: int
    stalls: int


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), so the peer sees ECONNRESET rather than a clean EOF."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.fileno() != -1:  # -1: already closed
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _close(*writers: asyncio.StreamWriter) -> None:
    """Close after flushing; abort any peer that will not take the last bytes within the grace
    period, or all of them if we are cancelled meanwhile. ``close()`` is called before the first
    await, so a cancellation can never leave a socket open."""
    for writer in writers:
        writer.close()
    flushed = False
    try:
        async with asyncio.timeout(_CLOSE_GRACE_S):
            # A peer that vanished while we flushed makes wait_closed raise: closed either way.
            await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        flushed = True
    except TimeoutError:
        pass
    finally:
        if not flushed:
            for writer in writers:
                writer.transport.abort()


@dataclass(eq=False, slots=True)
class _Conn:
    """One accepted client connection (held by a blackhole, or being forwarded)."""

    ordinal: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None


class DelayProxy:
    """Listen on ``route.listen_host:listen_port`` and forward to the upstream through the
    emulated link ``route.link``. Use ``async with`` or ``start()``/``close()``.

    ``max_in_flight_bytes`` bounds what one direction of one connection holds in its delay
    queue (backpressure beyond that, see :mod:`services.netem.pipe`).
    """

    def __init__(
        self, route: Route, *, max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES
    ) -> None:
        if max_in_flight_bytes < 1:
            raise InvalidRequest(
                f"max_in_flight_bytes must be >= 1, got {max_in_flight_bytes}",
                param="max_in_flight_bytes",
            )
        self._route = route
        self._link = route.link
        self._max_in_flight = max_in_flight_bytes
        self._server: asyncio.Server | None = None
        self._address: tuple[str, int] | None = None
        self._cut: CutMode | None = None
        self._gate = asyncio.Event()  # set while the link is up
        self._gate.set()
        self._conns: set[_Conn] = set()
        self._ordinals = itertools.count(1)
        self._connections_total = 0
        self._refused = 0
        self._blackholed = 0
        self._upstream_failures = 0
        self._bytes_up = 0
        self._bytes_down = 0
        self._stalls = 0

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Bind and listen. Raises ``OSError`` if the address cannot be bound."""
        if self._server is not None:
            raise RuntimeError("DelayProxy already started")
        route = self._route
        self._server = await asyncio.start_server(
            self._handle, route.listen_host, route.listen_port, reuse_address=True
        )
        bound = self._server.sockets[0].getsockname()
        self._address = (bound[0], bound[1])
        event(
            log,
            "netem.listening",
            route=route.name,
            host=bound[0],
            port=bound[1],
            upstream=f"{route.upstream_host}:{route.upstream_port}",
            **dataclasses.asdict(self._link),
        )

    async def close(self) -> None:
        """Stop listening and reset every connection (in-flight bytes are dropped)."""
        if self._server is not None:
            self._server.close()
        conns = list(self._conns)
        for conn in conns:
            self._reset_conn(conn)
        await asyncio.gather(
            *(conn.task for conn in conns if conn.task is not None), return_exceptions=True
        )
        if self._server is not None:
            await self._server.wait_closed()
            event(log, "netem.closed", route=self._route.name)

    async def __aenter__(self) -> DelayProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- what it is ----------------------------------------------------------------------

    @property
    def route(self) -> Route:
        return self._route

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the real port when the route asked for port 0."""
        if self._address is None:
            raise RuntimeError("DelayProxy not started")
        return self._address

    @property
    def host(self) -> str:
        return self.address[0]

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def link(self) -> LinkProfile:
        return self._link

    @property
    def cut_mode(self) -> CutMode | None:
        """The cut in effect, or None while the link is up."""
        return self._cut

    def stats(self) -> ProxyStats:
        return ProxyStats(
            connections_total=self._connections_total,
            connections_active=sum(1 for c in self._conns if c.upstream is not None),
            connections_refused=self._refused,
            connections_blackholed=self._blackholed,
            upstream_failures=self._upstream_failures,
            bytes_up=self._bytes_up,
            bytes_down=self._bytes_down,
            stalls=self._stalls,
        )

    # -- runtime controls ----------------------------------------------------------------

    def set_link(self, link: LinkProfile) -> None:
        """Replace the whole link profile; applies to every chunk read from now on."""
        self._link = link
        event(log, "netem.link_changed", route=self._route.name, **dataclasses.asdict(link))

    def set_delay(self, delay_ms: float, *, jitter_ms: float | None = None) -> None:
        """Change the one-way delay (and, if given, the jitter). Raises ``InvalidRequest``."""
        jitter = self._link.jitter_ms if jitter_ms is None else jitter_ms
        self.set_link(dataclasses.replace(self._link, delay_ms=delay_ms, jitter_ms=jitter))

    def set_loss(self, loss: float) -> None:
        """Change the per-chunk stall probability. Raises ``InvalidRequest`` outside [0, 1]."""
        self.set_link(dataclasses.replace(self._link, loss=loss))

    def cut(self, mode: CutMode | str = CutMode.REFUSE, *, reset_existing: bool = True) -> None:
        """Partition the route (see the module docstring for what each mode does).

        ``reset_existing=False`` (blackhole only) freezes current connections instead of
        resetting them. Raises ``InvalidRequest`` for an unknown mode, or for a refuse cut
        that would keep connections (a refusing host has no live connections).
        """
        try:
            cut_mode = CutMode(mode)
        except ValueError:
            known = ", ".join(m.value for m in CutMode)
            raise InvalidRequest(
                f"cut mode must be one of {known}, got {mode!r}", param="mode"
            ) from None
        if cut_mode is CutMode.REFUSE and not reset_existing:
            raise InvalidRequest(
                "a refuse cut resets existing connections; use blackhole to freeze them",
                param="reset_existing",
            )
        self._cut = cut_mode
        self._gate.clear()
        reset = 0
        if reset_existing:
            for conn in list(self._conns):
                self._reset_conn(conn)
                reset += 1
        event(
            log,
            "netem.cut",
            route=self._route.name,
            mode=cut_mode.value,
            reset_connections=reset,
            frozen_connections=len(self._conns) - reset,
        )

    def restore(self) -> None:
        """Heal a cut: frozen and held connections flow again, new ones are forwarded."""
        was = self._cut
        self._cut = None
        self._gate.set()
        if was is not None:
            event(log, "netem.restored", route=self._route.name, mode=was.value)

    # -- connections ---------------------------------------------------------------------

    def _reset_conn(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        _reset(conn.client)
        if conn.upstream is not None:
            _reset(conn.upstream)
        if conn.task is not None:
            conn.task.cancel()

    def _count_up(self, n: int) -> None:
        self._bytes_up += n

    def _count_down(self, n: int) -> None:
        self._bytes_down += n

    def _count_stall(self) -> None:
        self._stalls += 1

    def _current_link(self) -> LinkProfile:
        return self._link

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        """``start_server``'s callback. The work runs in a task of its own that ``cut`` and
        ``close`` may cancel; this callback's task must itself end normally (Python 3.11's
        streams call ``exception()`` on it, which raises for a cancelled task)."""
        if self._cut is CutMode.REFUSE:
            self._refused += 1
            _reset(client_w)
            return
        conn = _Conn(ordinal=next(self._ordinals), client=client_w)
        conn.task = asyncio.create_task(self._forward(conn, client_r))
        self._conns.add(conn)
        try:
            await asyncio.wait((conn.task,))
        finally:
            self._conns.discard(conn)
            # A task cancelled before its first step never runs _forward's ``finally``
            # (``close`` right after an accept): its sockets are closed here instead.
            for writer in (conn.client, conn.upstream):
                if writer is not None and not writer.transport.is_closing():
                    _reset(writer)

    async def _forward(self, conn: _Conn, client_r: asyncio.StreamReader) -> None:
        try:
            await self._hold_then_forward(conn, client_r)
        finally:
            # Whatever ended us (cancelled while held by a blackhole or while connecting
            # upstream, included), no socket outlives the connection.
            for writer in (conn.client, conn.upstream):
                if writer is not None and not writer.transport.is_closing():
                    _reset(writer)

    async def _hold_then_forward(self, conn: _Conn, client_r: asyncio.StreamReader) -> None:
        route = self._route
        if self._cut is CutMode.BLACKHOLE:
            self._blackholed += 1
            event(log, "netem.held", level=logging.DEBUG, route=route.name, conn=conn.ordinal)
        while self._cut is not None:
            if self._cut is CutMode.REFUSE:
                self._refused += 1
                _reset(conn.client)
                return
            await self._gate.wait()
        try:
            up_r, up_w = await asyncio.open_connection(route.upstream_host, route.upstream_port)
        except OSError as err:
            self._upstream_failures += 1
            event(
                log,
                "netem.upstream_failed",
                level=logging.WARNING,
                route=route.name,
                conn=conn.ordinal,
                error=str(err),
            )
            _reset(conn.client)
            return
        conn.upstream = up_w
        self._connections_total += 1
        event(log, "netem.opened", level=logging.DEBUG, route=route.name, conn=conn.ordinal)
        outcome = await self._run_pipes(conn, client_r, up_r, up_w)
        event(
            log,
            "netem.closed_connection",
            level=logging.DEBUG,
            route=route.name,
            conn=conn.ordinal,
            outcome=outcome.value,
        )

    async def _run_pipes(
        self,
        conn: _Conn,
        client_r: asyncio.StreamReader,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
    ) -> PipeEnd:
        key = f"{self._link.seed}/{self._route.name}/{conn.ordinal}"

        def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, direction: str) -> Pipe:
            schedule = LinkSchedule(
                self._current_link, rng_key=f"{key}/{direction}", on_stall=self._count_stall
            )
            on_bytes = self._count_up if direction == "up" else self._count_down
            return Pipe(
                src,
                dst,
                schedule=schedule,
                gate=self._gate,
                on_bytes=on_bytes,
                max_in_flight_bytes=self._max_in_flight,
            )

        tasks = {
            asyncio.create_task(pipe(client_r, up_w, "up").run()),
            asyncio.create_task(pipe(up_r, conn.client, "down").run()),
        }
        outcome = PipeEnd.EOF
        pending = tasks
        try:
            while pending and outcome is PipeEnd.EOF:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(t.result() is PipeEnd.RESET for t in done):
                    outcome = PipeEnd.RESET
        finally:
            # Sockets are dealt with before the first await: a second cancellation (``close``
            # racing this cleanup) must not leave one open.
            if outcome is PipeEnd.EOF and not pending:
                await _close(conn.client, up_w)  # both sides half-closed: a clean close
            else:
                # A reset on either side, or we were cancelled (cut or close): drop both.
                _reset(conn.client)
                _reset(up_w)
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        return outcome
