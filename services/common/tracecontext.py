"""W3C trace context across our hops: HTTP headers at the edge, gRPC metadata between services.

One propagator (W3C ``traceparent``/``tracestate``), so a client's incoming ``traceparent`` is
honoured and edge → router → worker spans land in one trace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()


def inject_metadata(context: Context | None = None) -> tuple[tuple[str, str], ...]:
    """gRPC metadata carrying the current (or given) span context; empty when none."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context)
    return tuple(carrier.items())


def extract_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Context:
    """The parent context a gRPC caller sent (an empty context when it sent none)."""
    carrier = {k: v for k, v in (metadata or ()) if isinstance(v, str)}
    return _PROPAGATOR.extract(carrier)


def extract_carrier(carrier: Mapping[str, str]) -> Context:
    """The parent context from a message's own metadata map (a stream's per-message
    ``traceparent``, where gRPC metadata is per call)."""
    return _PROPAGATOR.extract(carrier)


def extract_headers(headers: Mapping[str, str]) -> Context:
    """The parent context from HTTP headers (``traceparent``), case-insensitively."""
    carrier = {k.lower(): v for k, v in headers.items() if k.lower() in _PROPAGATOR.fields}
    return _PROPAGATOR.extract(carrier)
