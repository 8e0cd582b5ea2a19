"""The ``telemetry`` middleware, outermost: every request's SERVER span (child of the client's
``traceparent``), its duration and a count by status.

Outermost so that it sees the status the client really gets: a 429 the IP guard raises, turned
into an OpenAI error by the error boundary inside it, is recorded as a 429 — not as the
exception a middleware further in would see (and count as a 500).
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.common import metric_names as mn
from services.common.tracecontext import extract_headers
from services.edge.observability import EdgeTelemetry

#: The request's trace id (hex), for log lines and the ``x-trace-id`` header.
TRACE_ID = web.RequestKey("trace_id", str)


def telemetry_middleware(tel: EdgeTelemetry) -> Middleware:
    """Outermost middleware: the request's SERVER span, its duration and status counters."""
    tracer = tel.tracer

    @web.middleware
    async def telemetry(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.monotonic()
        route = request.match_info.route.resource
        path = route.canonical if route is not None else "unmatched"
        parent = extract_headers(request.headers)
        status = 500  # unless a response says otherwise
        with tracer.start_as_current_span(
            f"{request.method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": request.method, "url.path": request.path},
        ) as span:
            ctx = span.get_span_context()
            if ctx.is_valid:
                request[TRACE_ID] = format(ctx.trace_id, "032x")
            try:
                resp = await handler(request)
                status = resp.status
                if ctx.is_valid and not resp.prepared:
                    resp.headers["x-trace-id"] = request[TRACE_ID]
                return resp
            except asyncio.CancelledError:
                status = 499  # the client went away (nginx's convention)
                raise
            finally:
                span.set_attribute(mn.STATUS_CODE, status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                attrs: dict[str, str | int] = {mn.STATUS_CODE: status, "http.route": path}
                tel.requests.add(1, attrs)
                if path == "/v1/chat/completions":
                    tel.duration.record(time.monotonic() - started, attrs)

    return telemetry
