"""Finished spans → an OTLP ``ExportTraceServiceRequest``, written straight in protobuf's wire
format.

Why not the exporter's own encoder: it builds a protobuf object for every span, attribute,
value and event (~20–30 µs a span here), and a traced request ends five spans at the edge.
Writing the bytes directly costs a few µs, and most of a span's attributes repeat from request
to request (``meridian.region=kr``, ``http.request.method=POST``), so each distinct key/value
pair is encoded once and its bytes reused (a bounded cache).

The output is byte-for-byte a valid message of ``opentelemetry-proto``'s schema;
``tests/unit/common/test_otlp_wire.py`` parses it with the official classes and checks it
equals what the SDK's encoder produces for the same spans, attribute types, events, links,
status, trace state and dropped counts included.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext

_log = logging.getLogger(__name__)

# SpanFlags (trace.proto): the span's context says whether its parent was remote.
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_MAX_CACHED = 8192

_pack_times = struct.Struct("<BQBQ").pack  # start (field 7) and end (field 8), fixed64
_pack_fixed64 = struct.Struct("<Q").pack
_pack_double = struct.Struct("<d").pack
_pack_fixed32 = struct.Struct("<I").pack
_SMALL = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _sized(payload: bytes) -> bytes:
    """A length-delimited payload (what follows a field's tag)."""
    n = len(payload)
    return (_SMALL[n] if n < 0x80 else _varint(n)) + payload


class _InvalidValue(ValueError):
    pass


def _any_value(value: Any) -> bytes:
    """An ``AnyValue`` message's bytes, the value's type checked in the SDK encoder's order."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return b"\x0a" + _sized(value.encode())
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _InvalidValue(f"{value} does not fit an int64")
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return b"\x3a" + _sized(value)
    if isinstance(value, Sequence):
        return b"\x2a" + _sized(b"".join(b"\x0a" + _sized(_any_value(v)) for v in value))
    if isinstance(value, Mapping):
        pairs = b"".join(b"\x0a" + _key_value(str(k), v) for k, v in value.items())
        return b"\x32" + _sized(pairs)
    raise _InvalidValue(f"invalid type {type(value).__name__} of value {value!r}")


def _key_value(key: str, value: Any) -> bytes:
    """A sized ``KeyValue`` (to follow the tag of whichever field holds it)."""
    return _sized(b"\x0a" + _sized(key.encode()) + b"\x12" + _sized(_any_value(value)))


_kv_cache: dict[tuple[str, type, Any], bytes] = {}


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
    out: list[bytes] = []
    if not attributes:
        return out
    cache = _kv_cache
    for key, value in attributes.items():
        kind = type(value)
        cache_key = (key, kind, value) if kind in (str, int, float, bool) else None
        encoded = cache.get(cache_key) if cache_key is not None else None
        if encoded is None:
            try:
                encoded = _key_value(key, value)
            except _InvalidValue as err:
                _log.warning("attribute %r not exported: %s", key, err)
                continue
            if cache_key is not None:
                if len(cache) >= _MAX_CACHED:
                    cache.clear()  # high-cardinality values: start over rather than grow
                cache[cache_key] = encoded
        out.append(tag)
        out.append(encoded)
    return out


def _span_flags(parent: SpanContext | None) -> bytes:
    return _REMOTE_FLAGS if parent and parent.is_remote else _LOCAL_FLAGS


_LOCAL_FLAGS = _pack_fixed32(_HAS_IS_REMOTE)
_REMOTE_FLAGS = _pack_fixed32(_HAS_IS_REMOTE | _IS_REMOTE)
# ``kind`` (field 6) with its tag, by the API's SpanKind value (the proto's is one more).
_KINDS = [b"\x30" + _SMALL[value + 1] for value in range(5)]
_EMPTY_STATUS = b"\x7a\x00"


def _trace_state(context: SpanContext) -> str:
    state = context.trace_state
    return ",".join(f"{k}={v}" for k, v in state.items()) if state else ""


# (trace id, its field bytes) of the last span encoded: a request's spans share one trace id
# and end together. One tuple, swapped whole, so concurrent encoders never see a torn pair.
_last_trace: list[tuple[int, bytes]] = [(-1, b"")]


def encode_span(span: ReadableSpan) -> bytes:
    """One ``Span`` message (unsized)."""
    ctx = span.get_span_context()
    assert ctx is not None
    trace_id = ctx.trace_id
    last = _last_trace[0]
    if last[0] != trace_id:
        last = _last_trace[0] = (trace_id, b"\x0a\x10" + trace_id.to_bytes(16, "big"))
    parts = [last[1], b"\x12\x08", ctx.span_id.to_bytes(8, "big")]
    append = parts.append
    if ctx.trace_state:
        append(b"\x1a" + _sized(_trace_state(ctx).encode()))
    parent = span.parent
    if parent:
        append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    name = span.name
    if name:
        append(b"\x2a" + _sized(name.encode()))
    append(_KINDS[span.kind._value_])
    append(_pack_times(0x39, span.start_time or 0, 0x41, span.end_time or 0))
    parts += _attributes(b"\x4a", span.attributes)
    dropped = span.dropped_attributes
    if dropped:
        append(b"\x50" + _varint(dropped))
    for event in span.events:
        body = [b"\x09", _pack_fixed64(event.timestamp)]
        if event.name:
            body += (b"\x12", _sized(event.name.encode()))
        body += _attributes(b"\x1a", event.attributes)
        dropped = getattr(event, "dropped_attributes", 0)
        if dropped:
            body.append(b"\x20" + _varint(dropped))
        append(b"\x5a" + _sized(b"".join(body)))
    dropped = span.dropped_events
    if dropped:
        append(b"\x60" + _varint(dropped))
    for link in span.links:
        lctx = link.context
        body = [b"\x0a\x10", lctx.trace_id.to_bytes(16, "big"), b"\x12\x08"]
        body.append(lctx.span_id.to_bytes(8, "big"))
        body += _attributes(b"\x22", link.attributes)
        if link.dropped_attributes:
            body.append(b"\x28" + _varint(link.dropped_attributes))
        body += (b"\x35", _span_flags(lctx))
        append(b"\x6a" + _sized(b"".join(body)))
    dropped = span.dropped_links
    if dropped:
        append(b"\x70" + _varint(dropped))
    status = span.status
    code = status.status_code._value_
    if code or status.description:
        body = []
        if status.description:
            body += (b"\x12", _sized(status.description.encode()))
        if code:
            body.append(b"\x18" + _SMALL[code])
        append(b"\x7a" + _sized(b"".join(body)))
    else:
        append(_EMPTY_STATUS)
    append(b"\x85\x01")
    append(_span_flags(parent))
    return b"".join(parts)


# Keyed by identity: a Resource hashes by JSON-encoding its attributes (µs per span), and a
# service has one resource and a scope or two for its whole life. The object is kept in the
# entry so that its id cannot be reused while cached.
_resource_cache: dict[int, tuple[Resource, bytes]] = {}
_scope_cache: dict[int, tuple[InstrumentationScope | None, bytes]] = {}


def _resource(resource: Resource) -> bytes:
    """``ResourceSpans.resource`` with its tag."""
    entry = _resource_cache.get(id(resource))
    if entry is not None and entry[0] is resource:
        return entry[1]
    encoded = b"\x0a" + _sized(b"".join(_attributes(b"\x0a", resource.attributes)))
    if len(_resource_cache) >= 64:
        _resource_cache.clear()
    _resource_cache[id(resource)] = (resource, encoded)
    return encoded


def _scope(scope: InstrumentationScope | None) -> bytes:
    """``ScopeSpans.scope`` with its tag (always present, empty when there is none)."""
    entry = _scope_cache.get(id(scope))
    if entry is not None and entry[0] is scope:
        return entry[1]
    body: list[bytes] = []
    if scope is not None:
        if scope.name:
            body += (b"\x0a", _sized(scope.name.encode()))
        if scope.version:
            body += (b"\x12", _sized(scope.version.encode()))
        body += _attributes(b"\x1a", scope.attributes)
    encoded = b"\x0a" + _sized(b"".join(body))
    if len(_scope_cache) >= 256:
        _scope_cache.clear()
    _scope_cache[id(scope)] = (scope, encoded)
    return encoded


def _schema_url(tag: bytes, url: str | None) -> bytes:
    return tag + _sized(url.encode()) if url else b""


def encode_export_request(spans: Sequence[ReadableSpan]) -> bytes:
    """The ``ExportTraceServiceRequest`` carrying ``spans``, grouped by resource and then by
    instrumentation scope in order of first appearance (as the SDK's encoder groups them).

    Resources and scopes are grouped by identity first (cheap), then merged by equality, so
    two equal resource objects still make one ``ResourceSpans``, as in the SDK.
    """
    by_id: dict[tuple[int, int], tuple[Resource, InstrumentationScope | None, list[bytes]]] = {}
    for span in spans:
        resource = span.resource
        scope = span.instrumentation_scope or None
        key = (id(resource), id(scope))
        group = by_id.get(key)
        if group is None:
            group = by_id[key] = (resource, scope, [])
        group[2].extend((b"\x12", _sized(encode_span(span))))
    grouped: dict[Resource, dict[InstrumentationScope | None, list[bytes]]] = {}
    for resource, scope, encoded in by_id.values():
        grouped.setdefault(resource, {}).setdefault(scope, []).extend(encoded)
    out: list[bytes] = []
    for resource, by_scope in grouped.items():
        body = [_resource(resource)]
        for scope, encoded_spans in by_scope.items():
            scope_body = _scope(scope) + b"".join(encoded_spans)
            scope_body += _schema_url(b"\x1a", scope.schema_url if scope else None)
            body += (b"\x12", _sized(scope_body))
        body.append(_schema_url(b"\x1a", resource.schema_url))
        out += (b"\x0a", _sized(b"".join(body)))
    return b"".join(out)
