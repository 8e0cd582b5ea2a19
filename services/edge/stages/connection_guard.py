"""The ``connection_guard`` stage, first of the chat pipeline: refuse new work while draining,
and cap concurrent streams per client IP and per edge (the limits that need no identity; see
:mod:`services.edge.guard` for the connection-level ones). What it admits is in flight for
the drain (``Lifecycle.request``): waited for, then cut at the drain deadline."""

from __future__ import annotations

from aiohttp import web

from services.common.errors import Overloaded, RateLimited, Unavailable
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.guard import Lifecycle, Occupancy, Refusal, client_ip
from services.edge.middleware.telemetry import TRACE_ID
from services.edge.pipeline import Next


class ConnectionGuard:
    """The chat pipeline's first stage: concurrent streams per client IP and per edge."""

    name = "connection_guard"

    def __init__(self, *, streams: Occupancy, lifecycle: Lifecycle, counters: EdgeCounters) -> None:
        self._streams = streams
        self._lifecycle = lifecycle
        self._counters = counters

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse:
        if self._lifecycle.draining:
            self._counters.refused_while_draining += 1
            raise Unavailable("This edge is shutting down; retry.", retry_after_s=1.0)
        ip = client_ip(ctx.request)
        refusal = self._streams.try_acquire(ip)
        if refusal is Refusal.IP:
            self._counters.streams_refused_ip += 1
            raise RateLimited("Too many concurrent requests from your address.", retry_after_s=1.0)
        if refusal is Refusal.EDGE:
            self._counters.streams_refused_edge += 1
            raise Overloaded("This edge is at its concurrent request limit.", retry_after_s=1.0)
        try:
            async with self._lifecycle.request(ctx.request.get(TRACE_ID, "")) as flight:
                ctx.in_flight = flight
                return await call_next(ctx)
        finally:
            self._streams.release(ip)
