"""Connection-level abuse limits, where aiohttp lets them live: in the protocol object of each
connection (a :class:`aiohttp.web.RequestHandler` subclass) and in a listener that creates it.

Per connection:

- **live connections per client IP and per edge**: counted from ``connection_made`` to
  ``connection_lost``. A connection over a cap is not dropped blindly: its first request is
  answered with an OpenAI-style 429 (per IP) or 503 (per edge) by the ``ip_guard`` middleware
  (:mod:`services.edge.middleware.ip_guard`), then the connection is closed;
- **header deadline (slow-loris)**: from the connection (or the first byte of the next
  request on a kept-alive connection) the request line and headers must be complete within
  ``header_timeout_s``, however slowly the bytes trickle in; otherwise a raw 408 with an
  OpenAI-style body is written and the connection closed;
- **idle timeout**: aiohttp's keep-alive timeout (``idle_timeout_s``) closes quiet connections;
- **header size and count**: aiohttp's parser limits; its errors are answered here in the API's
  JSON format (431 for too large, 400 for malformed) instead of aiohttp's plain text;
- **TLS handshake deadline**: ``ssl_handshake_timeout`` of the listening socket.

Every violation is counted (:class:`~services.edge.counters.EdgeCounters`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError, LineTooLong

from services.common.errors import (
    InternalError,
    InvalidRequest,
    MeridianError,
    Unavailable,
)
from services.common.httpapp import SERVER_HEADER
from services.common.logs import event
from services.common.startup import listen_failed
from services.edge.counters import EdgeCounters
from services.edge.guard import GuardConfig, Occupancy, Refusal
from services.edge.httperrors import (
    HeadersTooLarge,
    HttpVersionNotSupported,
    RequestTimeout,
    UriTooLong,
)

log = logging.getLogger("meridian.edge.protocol")


#: How long a connection cut off for slow headers keeps draining input before it closes.
_LINGER_S = 1.0


def _raw_response(err: MeridianError, reason: str) -> bytes:
    body = json.dumps(err.to_openai(), separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {err.http_status} {reason}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class GuardedRequestHandler(web.RequestHandler):
    """aiohttp's per-connection protocol, plus connection caps and a header deadline."""

    def __init__(
        self,
        manager: web.Server,
        *,
        connections: Occupancy,
        counters: EdgeCounters,
        config: GuardConfig,
        loop: asyncio.AbstractEventLoop,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._connections = connections
        self._counters = counters
        self._config = config
        self._ip = "unknown"
        self.refusal: Refusal | None = None
        self._registered = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_request = False
        self._lingering = False
        self._partial_request = False  # bytes of a request that has not started yet
        self._drain_waiters: list[asyncio.Future[None]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self._ip = str(peer[0])
        self.refusal = self._connections.try_acquire(self._ip)
        if self.refusal is None:
            self._registered = True
            self._counters.connections_accepted += 1
        elif self.refusal is Refusal.IP:
            self._counters.connections_refused_ip += 1
        else:
            self._counters.connections_refused_edge += 1
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_header_timer()
        if self._registered:
            self._registered = False
            self._connections.release(self._ip)
        self._wake_drain_waiters()  # their next write fails with the connection's error
        super().connection_lost(exc)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._wake_drain_waiters()

    async def until_drained(self) -> None:
        """Until every byte written so far has been handed to the kernel (the client caught
        up), or the connection is gone. The stream stage waits on this while it holds tokens
        for a client that is behind (services/edge/chunk_merge.py).

        The transport only says so by resuming a paused writer, at its low-water mark: for
        the wait its marks are 0/0 (paused while anything waits, resumed when nothing does),
        then the defaults again."""
        transport = self.transport
        if transport is None or transport.is_closing() or not transport.get_write_buffer_size():
            return
        transport.set_write_buffer_limits(high=0, low=0)  # pauses us now: bytes are waiting
        waiter: asyncio.Future[None] = self._loop.create_future()
        try:
            if not self.writing_paused:
                return
            self._drain_waiters.append(waiter)
            await waiter
        finally:
            if not waiter.done():
                waiter.cancel()
            if waiter in self._drain_waiters:
                self._drain_waiters.remove(waiter)  # cancelled: the next chunk came first
            if not transport.is_closing():
                transport.set_write_buffer_limits()

    def _wake_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the 408 is sent: what the client still trickles in is read and dropped
        if data and not self._in_request:
            self._partial_request = True
            if self._header_timer is None:
                self._arm_header_timer()  # the first byte of the next request on this connection
        super().data_received(data)

    def close(self) -> None:
        """aiohttp's close — "no next request; close once the one running is answered", what
        ``Server.pre_shutdown`` asks of every connection when the edge starts draining — and
        what aiohttp leaves out for a connection that has no request running (an SDK's idle
        keep-alive connection): it only stops reading it, and leaves it open until the
        runner's shutdown, after the whole drain grace, so a request sent on it got no answer
        for the grace and then a bare close. Such a connection closes now (one whose next
        request had begun to arrive is answered 503 first), so clients retry elsewhere at once."""
        waiter = self._waiter
        idle = waiter is not None and not waiter.done() and not self._in_request
        super().close()
        if not idle or self.transport is None or self._lingering:
            return
        if self._partial_request:
            self._answer_and_close(
                Unavailable("This edge is shutting down; retry."), "Service Unavailable"
            )
        else:
            self.force_close()

    # Called by the ip_guard middleware around each parsed request.
    def request_started(self) -> None:
        self._cancel_header_timer()
        self._in_request = True
        self._partial_request = False

    def request_finished(self) -> None:
        self._in_request = False

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self._loop.call_later(
            self._config.header_timeout_s, self._on_header_timeout
        )

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self._in_request or self.transport is None:
            return
        self._counters.header_timeouts += 1
        err = RequestTimeout(
            f"The request headers did not arrive within {self._config.header_timeout_s:g}s."
        )
        self._answer_and_close(err, "Request Timeout")

    def _answer_and_close(self, err: MeridianError, reason: str) -> None:
        """Answer ``err`` on a connection with no request running, and close it."""
        transport = self.transport
        assert transport is not None
        transport.write(_raw_response(err, reason))
        # A lingering close: closing a socket with unread input makes the kernel send a reset,
        # which can reach the client before the answer does. So stop parsing, half-close (plain
        # TCP), keep reading and dropping for a moment, then close.
        self._lingering = True
        if transport.can_write_eof():
            transport.write_eof()
        self._loop.call_later(_LINGER_S, self.force_close)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's parser and last-resort errors, in the API's JSON format (never a trace)."""
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error")
        err: MeridianError
        if isinstance(exc, LineTooLong) and _is_request_target(exc):
            self._counters.headers_too_large += 1
            err = UriTooLong(
                f"Request-URI too long: at most {self._config.max_header_bytes} bytes."
            )
        elif isinstance(exc, LineTooLong) or (
            isinstance(exc, BadHttpMessage) and "too many headers" in str(exc).lower()
        ):
            self._counters.headers_too_large += 1
            err = HeadersTooLarge(
                "Request header fields too large: at most "
                f"{self._config.max_headers} headers of {self._config.max_header_bytes} bytes."
            )
        elif isinstance(exc, BadHttpMessage) and "PRI" in str(exc):
            # The HTTP/2 connection preface (h2c "prior knowledge"): aiohttp's parser stops
            # on it and says so in its own words; say what to do instead.
            self._counters.bad_http_requests += 1
            err = HttpVersionNotSupported(
                "HTTP/2 is not supported (this was an HTTP/2 connection preface): this "
                "endpoint speaks HTTP/1.1."
            )
        elif status == 400 or isinstance(exc, HttpProcessingError):
            self._counters.bad_http_requests += 1
            detail = message or (exc.message if isinstance(exc, HttpProcessingError) else "")
            if "Invalid HTTP version" in detail:  # HTTP/1.2, HTTP/3.0: aiohttp's parser stops
                version = _HTTP_VERSION.search(detail)
                err = HttpVersionNotSupported.of(version.group(0) if version else "")
            else:
                err = InvalidRequest(f"The HTTP request could not be parsed: {_said(detail)}")
        else:
            event(log, "http.error", level=logging.WARNING, status=status, error=repr(exc))
            err = InternalError("internal error")
        resp = web.json_response(
            err.to_openai(), status=err.http_status, headers={"Server": SERVER_HEADER}
        )
        resp.force_close()
        return resp


_HTTP_VERSION = re.compile(r"HTTP/[0-9]\.[0-9]")


def _said(detail: str) -> str:
    """What aiohttp's parser said, without the request bytes it echoes: its message is a few
    lines (``Bad status line:`` / ``Invalid method encountered:``, then the line it read and a
    caret), and the first alone says little. At most 120 characters."""
    parts = []
    for line in detail.strip().splitlines():
        line = line.strip()
        if line.startswith(("b'", 'b"', "^")):
            break
        if line:
            parts.append(line.rstrip(":"))
    return ": ".join(parts)[:120] or "malformed"


def _is_request_target(exc: LineTooLong) -> bool:
    """Whether the line over the limit is the request line's target, not a header: aiohttp
    raises the same error for both, with the line's first bytes — the target's start with
    ``/`` or a scheme (absolute form), or the method (its pure-Python parser); a header name
    cannot start with either."""
    line = bytes(exc.args[0]) if exc.args and isinstance(exc.args[0], bytes | bytearray) else b""
    return line.startswith((b"/", b"http://", b"https://")) or _METHOD_SP.match(line) is not None


_METHOD_SP = re.compile(rb"[A-Z]{3,7} ")


class Listener:
    """A listening socket whose connections get :class:`GuardedRequestHandler` protocols.

    aiohttp's own sites build plain ``RequestHandler``s; the protocol factory is the one
    place a subclass can be put in, so the edge opens its listening socket itself.
    """

    def __init__(
        self,
        *,
        server: web.Server,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        config: GuardConfig,
        connections: Occupancy,
        counters: EdgeCounters,
        backlog: int = 1024,
        reuse_port: bool = False,
    ) -> None:
        self._server = server
        self._reuse_port = reuse_port
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._config = config
        self._connections = connections
        self._counters = counters
        self._backlog = backlog
        self._listening: asyncio.Server | None = None

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        cfg = self._config

        def factory() -> GuardedRequestHandler:
            return GuardedRequestHandler(
                self._server,
                connections=self._connections,
                counters=self._counters,
                config=cfg,
                loop=loop,
                keepalive_timeout=cfg.idle_timeout_s,
                max_line_size=cfg.max_header_bytes,
                max_field_size=cfg.max_header_bytes,
                max_headers=cfg.max_headers,
                lingering_time=1.0,
                access_log=None,
                # Bodies are decoded by the handlers that read them (request_body.py), where
                # a bad or unknown Content-Encoding is a 400/415 rather than a parser failure.
                auto_decompress=False,
            )

        try:
            self._listening = await loop.create_server(
                factory,
                self._host,
                self._port,
                ssl=self._ssl,
                ssl_handshake_timeout=cfg.tls_handshake_timeout_s if self._ssl else None,
                backlog=self._backlog,
                reuse_address=True,
                reuse_port=self._reuse_port or None,
            )
        except OSError as err:
            raise listen_failed("the public API", self._host, self._port, err) from None
        sock = self._listening.sockets[0]
        return int(sock.getsockname()[1])

    def close(self) -> None:
        """Stop accepting connections (live ones are left to the runner's shutdown)."""
        if self._listening is not None:
            self._listening.close()
