"""The ``ip_guard`` middleware, innermost: the per-client-IP request-rate bucket in front of
every route (so a flood is refused before it touches Redis), and the answer (429/503, then
close) to a connection the protocol marked as over its per-IP or per-edge cap, and the 505
to a request line in an HTTP version the edge does not speak (aiohttp parses ``HTTP/2.0``,
``HTTP/0.9`` and a line with no version as if they were HTTP/1).

It raises; the error boundary outside it renders the OpenAI error.
"""

from __future__ import annotations

from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.typedefs import Handler, Middleware

from services.common.errors import Overloaded, RateLimited
from services.edge.counters import EdgeCounters
from services.edge.guard import IpBuckets, Refusal, client_ip
from services.edge.httperrors import HttpVersionNotSupported
from services.edge.protocol import GuardedRequestHandler

_SPOKEN = frozenset({HttpVersion10, HttpVersion11})


def ip_guard(*, buckets: IpBuckets, counters: EdgeCounters) -> Middleware:
    """Tells the protocol a request began (header deadline met); answers connections over
    their cap; applies the per-IP request-rate bucket to every route."""

    @web.middleware
    async def ip_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        proto = request.protocol if isinstance(request.protocol, GuardedRequestHandler) else None
        if proto is not None:
            proto.request_started()
        try:
            if proto is not None and proto.refusal is not None:
                proto.close()  # this request gets its answer, then the connection closes
                if proto.refusal is Refusal.IP:
                    raise RateLimited(
                        "Too many open connections from your address.", retry_after_s=1.0
                    )
                raise Overloaded("This edge is at its connection limit.", retry_after_s=1.0)
            if request.version not in _SPOKEN:
                major, minor = request.version
                raise HttpVersionNotSupported.of(f"HTTP/{major}.{minor}")
            wait_s = buckets.take(client_ip(request))
            if wait_s > 0:
                counters.ip_rate_limited += 1
                raise RateLimited(
                    "Too many requests from your address; slow down.", retry_after_s=wait_s
                )
            return await handler(request)
        finally:
            if proto is not None:
                proto.request_finished()

    return ip_guard
