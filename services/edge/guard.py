"""The connection guard: abuse limits that come before anyone is authenticated.

Three places, because aiohttp gives each limit a natural home:

- **per connection** (:mod:`services.edge.protocol`): live connections per client IP and per
  edge, the header-read deadline (slow-loris) and header size/count — none of these can be a
  pipeline stage, since they act before (or instead of) a parsed request;
- **per request, every route** (:func:`services.edge.middleware.ip_guard.ip_guard`): a token
  bucket per client IP in front of everything that could touch Redis, and the answer to a
  connection the protocol marked as over its limit;
- **per chat request** (:class:`~services.edge.stages.connection_guard.ConnectionGuard`, the
  pipeline's first stage): concurrent
  streams per client IP and per edge, and refusing new work while draining — what it admits
  is in flight for the drain (:class:`Lifecycle`), which cuts it at its deadline.

The client IP is the TCP peer: the edge terminates client connections itself. (Behind a
trusted proxy, that proxy must enforce these limits, or the edge would need the PROXY
protocol — not implemented.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType

from aiohttp import web

from services.common.clock import Clock
from services.edge.httperrors import Interrupted, ShuttingDown


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardConfig:
    max_connections: int = 10_000
    max_connections_per_ip: int = 256
    max_streams: int = 4096
    max_streams_per_ip: int = 64
    #: Requests per second per client IP (token bucket) and its burst; 0 turns it off.
    ip_requests_per_s: float = 100.0
    ip_burst: int = 200
    #: From connection (or from the first byte of the next request) to a complete header.
    header_timeout_s: float = 10.0
    #: Keep-alive: an idle connection is closed after this long.
    idle_timeout_s: float = 75.0
    #: Reading the request body.
    body_timeout_s: float = 30.0
    #: One write to a client that stopped reading (its socket buffer full).
    write_timeout_s: float = 30.0
    tls_handshake_timeout_s: float = 10.0
    max_header_bytes: int = 8190  # one header line / field
    max_headers: int = 64

    def __post_init__(self) -> None:
        for name in (
            "max_connections",
            "max_connections_per_ip",
            "max_streams",
            "max_streams_per_ip",
            "ip_burst",
            "max_header_bytes",
            "max_headers",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in (
            "header_timeout_s",
            "idle_timeout_s",
            "body_timeout_s",
            "write_timeout_s",
            "tls_handshake_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.ip_requests_per_s < 0:
            raise ValueError("ip_requests_per_s must be >= 0")


class Refusal(StrEnum):
    IP = "ip"
    EDGE = "edge"


class Occupancy:
    """Live things (connections or streams) per client IP and in total, with caps."""

    def __init__(self, *, max_total: int, max_per_ip: int) -> None:
        self._max_total = max_total
        self._max_per_ip = max_per_ip
        self.total = 0
        self._per_ip: dict[str, int] = {}

    def try_acquire(self, ip: str) -> Refusal | None:
        if self.total >= self._max_total:
            return Refusal.EDGE
        held = self._per_ip.get(ip, 0)
        if held >= self._max_per_ip:
            return Refusal.IP
        self._per_ip[ip] = held + 1
        self.total += 1
        return None

    def release(self, ip: str) -> None:
        held = self._per_ip.get(ip, 0)
        if held <= 1:
            self._per_ip.pop(ip, None)
        else:
            self._per_ip[ip] = held - 1
        self.total = max(0, self.total - 1)

    def held_by(self, ip: str) -> int:
        return self._per_ip.get(ip, 0)


class IpBuckets:
    """A token bucket per client IP: ``rate`` requests/s sustained, ``burst`` at once.

    Memory is bounded: past ``max_ips`` entries, buckets that have refilled completely (which
    carry no information) are dropped.
    """

    def __init__(self, *, rate: float, burst: int, clock: Clock, max_ips: int = 100_000) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._max_ips = max_ips
        self._buckets: dict[str, tuple[float, float]] = {}  # ip -> (tokens, at)

    def take(self, ip: str) -> float:
        """0 if the request may pass (a token is taken), else seconds until one is there."""
        if self._rate <= 0:
            return 0.0
        now = self._clock.monotonic()
        tokens, at = self._buckets.get(ip, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        if tokens < 1.0:
            self._buckets[ip] = (tokens, now)
            return (1.0 - tokens) / self._rate
        if len(self._buckets) >= self._max_ips and ip not in self._buckets:
            self._evict_full(now)
        self._buckets[ip] = (tokens - 1.0, now)
        return 0.0

    def _evict_full(self, now: float) -> None:
        full = [
            ip
            for ip, (tokens, at) in self._buckets.items()
            if tokens + (now - at) * self._rate >= self._burst
        ]
        for ip in full:
            del self._buckets[ip]
        if len(self._buckets) >= self._max_ips:  # everyone is busy: forget the oldest half
            for ip in list(self._buckets)[: self._max_ips // 2]:
                del self._buckets[ip]


#: What a request cut at the drain deadline is told (a 503, or its stream's last event).
SHUTTING_DOWN_MESSAGE = (
    "The edge is shutting down: this request was still running when its drain grace period "
    "ended. Retry."
)


class CutScope:
    """Where a request may be cut (the drain deadline, its key revoked): leaving the block
    raises the cut's :class:`~services.edge.httperrors.Interrupted` once :meth:`Lifecycle.cut`
    or :meth:`Lifecycle.cut_where` has reached it (the block's pending await is cancelled, so
    its own ``finally`` clauses run first).

    An :class:`asyncio.Timeout` that only the cut reschedules (to now). A request holds a
    stack of them (the connection guard's around the whole pipeline, a stream stage's around
    what it sends); the cut expires the innermost alone, so the stage that can still tell the
    client (an SSE error event) is the one that sees it. A client that leaves at the same
    moment wins: its cancellation stays a ``CancelledError``."""

    __slots__ = ("_flight", "_timeout")

    def __init__(self, flight: InFlight) -> None:
        self._flight = flight
        self._timeout = asyncio.timeout(None)

    async def __aenter__(self) -> None:
        if self._flight.cut is not None:
            raise self._flight.cut
        await self._timeout.__aenter__()
        self._flight.scopes.append(self._timeout)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._flight.scopes.remove(self._timeout)
        try:
            await self._timeout.__aexit__(exc_type, exc, tb)
        except TimeoutError:
            if self._flight.cut is None:  # pragma: no cover - only a cut reschedules it
                raise
            raise self._flight.cut from None
        return False


class InFlight:
    """One API request between the connection guard's admission and its end."""

    __slots__ = ("cut", "key_digest", "scopes", "streaming", "tenant_id", "trace_id")

    def __init__(self, trace_id: str = "") -> None:
        self.trace_id = trace_id  # for the log line of a cut
        #: Its response is an SSE stream whose headers are sent (set by the stream stages).
        self.streaming = False
        #: Why it was cut (the drain deadline, its key revoked); None while it may run.
        self.cut: Interrupted | None = None
        #: Whose it is, once authenticated (set by the authenticate stage): what a key's or
        #: a tenant's change is matched against.
        self.key_digest = ""
        self.tenant_id = ""
        self.scopes: list[asyncio.Timeout] = []

    def scope(self) -> CutScope:
        return CutScope(self)

    def _expire(self, why: Interrupted) -> None:
        if self.cut is not None:
            return  # once: its scope is already expiring
        self.cut = why
        if self.scopes:
            self.scopes[-1].reschedule(asyncio.get_running_loop().time())


def cut_scope(flight: InFlight | None) -> contextlib.AbstractAsyncContextManager[None]:
    """``flight``'s :class:`CutScope`; none (a no-op) for a stage run outside the pipeline."""
    return flight.scope() if flight is not None else contextlib.nullcontext()


@dataclass(frozen=True, slots=True)
class Cut:
    """What a cut ended: live SSE streams, and requests with no response yet."""

    streams: int
    requests: int


class Lifecycle:
    """Whether the edge is draining (SIGTERM): it then refuses new chat requests with 503.

    It also knows every API request in flight (:meth:`request`, entered by the connection
    guard), so the drain can wait for them (:meth:`wait_idle`) and, when its grace is over,
    end those still running (:meth:`cut`) instead of leaving them to aiohttp, which would
    wait a second grace period and then drop the connections without a word.
    """

    def __init__(self) -> None:
        self.draining = False
        self._live: set[InFlight] = set()
        self._idle: asyncio.Event | None = None
        self._past_deadline = False

    @property
    def in_flight(self) -> int:
        return len(self._live)

    @contextlib.asynccontextmanager
    async def request(self, trace_id: str = "") -> AsyncIterator[InFlight]:
        """One request in flight, cuttable anywhere inside (its outermost :class:`CutScope`:
        a cut request that has sent nothing gets its error's status from the error
        boundary)."""
        flight = InFlight(trace_id)
        if self._past_deadline:
            flight.cut = _shutting_down()
        self._live.add(flight)
        try:
            async with flight.scope():
                yield flight
        finally:
            self._live.discard(flight)
            if not self._live and self._idle is not None:
                self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Until no request is in flight (True) or ``timeout_s`` has passed (False)."""
        if self._live:
            if self._idle is None:
                self._idle = asyncio.Event()
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._idle.wait()
        return not self._live

    def cut(self) -> Cut:
        """The drain deadline: end every request still in flight, and any that starts now.
        Each sees :class:`~services.edge.httperrors.ShuttingDown` in its innermost scope;
        its stage's ``finally`` clauses cancel the worker call and settle its usage as for
        any request that ends early."""
        self._past_deadline = True
        return self.cut_where(lambda _: True, _shutting_down())

    def live(self) -> list[InFlight]:
        """The requests in flight now."""
        return list(self._live)

    def cut_where(self, match: Callable[[InFlight], bool], why: Interrupted) -> Cut:
        """End every request in flight that ``match`` picks, with ``why`` (its last SSE event,
        or its response): a revoked key's, a disabled tenant's."""
        streams = requests = 0
        for flight in list(self._live):
            if flight.cut is None and match(flight):
                streams += flight.streaming
                requests += not flight.streaming
                flight._expire(why)
        return Cut(streams=streams, requests=requests)


def _shutting_down() -> ShuttingDown:
    return ShuttingDown(SHUTTING_DOWN_MESSAGE, retry_after_s=1.0)


def client_ip(request: web.BaseRequest) -> str:
    return request.remote or "unknown"
