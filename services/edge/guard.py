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
  streams per client IP and per edge, and refusing new work while draining.

The client IP is the TCP peer: the edge terminates client connections itself. (Behind a
trusted proxy, that proxy must enforce these limits, or the edge would need the PROXY
protocol — not implemented.)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from aiohttp import web

from services.common.clock import Clock


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


class Lifecycle:
    """Whether the edge is draining (SIGTERM): it then refuses new chat requests with 503."""

    def __init__(self) -> None:
        self.draining = False


def client_ip(request: web.BaseRequest) -> str:
    return request.remote or "unknown"
