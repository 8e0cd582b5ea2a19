"""A lean implementation of the OpenTelemetry tracing API for the request path.

Why not the SDK's ``TracerProvider``: at 100 % sampling its spans cost the edge ~60 µs each
(``bench/telemetry_overhead.py``), and a request makes five. Most of that is bookkeeping a
span on an event loop does not need: a lock around every attribute write, a
``BoundedAttributes`` mapping (with its own lock) per span and per event, a context manager
built from a generator, and a fresh ``ReadableSpan`` copy of every span when it ends.

:class:`LeanSpan` keeps the same data and the same rules — attribute and event limits from the
standard ``OTEL_*_LIMIT`` variables (the SDK's ``SpanLimits``), value cleaning, the status
rules, exceptions recorded as events — but stores attributes in a plain dict and *is* its own
``ReadableSpan``: once ended it never changes, so it is handed to the span processors as is.
That makes every SDK span processor and exporter work with it (``BatchSpanProcessor``,
``InMemorySpanExporter``, the SDK's OTLP exporter), and :class:`LeanTracer` honours the SDK's
samplers and id generators, so it is a drop-in replacement for ``TracerProvider.get_tracer``.

Spans are meant to be used from one thread (an event loop), like the rest of a service's
request state; ending a span twice or writing to an ended one is ignored, as in the SDK.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv.attributes.exception_attributes import (
    EXCEPTION_ESCAPED,
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
)
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState
from opentelemetry.util import types

_log = logging.getLogger(__name__)

_UNSET = Status(StatusCode.UNSET)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
_NOT_SAMPLED_RANDOM = TraceFlags(TraceFlags.RANDOM_TRACE_ID)
# Exact types that are already valid attribute values (no copy, no cleaning needed).
_SCALARS = frozenset({bool, int, float, bytes, type(None)})
_PLAIN = frozenset({str, bool, int, float})


def clean_value(value: Any, max_len: int | None) -> types.AnyValue:
    """An attribute value as the SDK would store it: strings cut to ``max_len``, sequences
    frozen to tuples, anything else cleaned by the API's own ``BoundedAttributes`` rules."""
    kind = type(value)
    if kind is str:
        text: str = value
        return text if max_len is None or len(text) <= max_len else text[:max_len]
    if kind in _SCALARS:
        return value  # type: ignore[no-any-return]
    # Rare shapes (sequences, mappings, enums, objects): the API's own cleaning.
    cleaned: types.AnyValue = BoundedAttributes(None, {"v": value}, max_value_len=max_len)["v"]
    return cleaned


def bounded(
    attributes: Mapping[str, Any], max_count: int | None, max_len: int | None
) -> tuple[dict[str, types.AnyValue], int]:
    """A fresh attribute dict within the limits, and how many attributes did not fit."""
    if (max_count is None or len(attributes) <= max_count) and max_len is None:
        # The usual case (few attributes of plain types, no length limit): check, then copy.
        for key, value in attributes.items():
            if type(key) is not str or not key or type(value) not in _PLAIN:
                break
        else:
            return dict(attributes), 0
    out: dict[str, types.AnyValue] = {}
    dropped = 0
    for key, value in attributes.items():
        dropped += put(out, key, value, max_count, max_len)
    return out, dropped


def put(
    attrs: dict[str, types.AnyValue],
    key: str,
    value: Any,
    max_count: int | None,
    max_len: int | None,
) -> int:
    """Set one attribute as the SDK's ``BoundedAttributes`` would: an existing key moves last;
    at the limit the oldest attribute goes. Returns how many were dropped (0 or 1)."""
    if type(key) is not str or not key:
        _log.warning("invalid attribute key %r: must be a non-empty string; dropped", key)
        return 0
    dropped = 0
    if key in attrs:
        del attrs[key]
    elif max_count is not None and len(attrs) >= max_count:
        dropped = 1
        if not attrs:
            return dropped
        del attrs[next(iter(attrs))]
    kind = type(value)
    if kind is str:
        if max_len is not None and len(value) > max_len:
            value = value[:max_len]
    elif kind not in _SCALARS:
        value = clean_value(value, max_len)
    attrs[key] = value
    return dropped


class LeanEvent(Event):
    """An SDK ``Event`` that knows how many attributes its limit dropped."""

    def __init__(
        self, name: str, attributes: dict[str, types.AnyValue], dropped: int, timestamp: int | None
    ) -> None:
        super().__init__(name, attributes, timestamp)
        self._dropped = dropped

    @property
    def dropped_attributes(self) -> int:
        return self._dropped


class LeanLink(Link):
    """An API ``Link`` that knows how many attributes its limit dropped."""

    def __init__(
        self, context: SpanContext, attributes: dict[str, types.AnyValue], dropped: int
    ) -> None:
        super().__init__(context, attributes)
        self._dropped = dropped

    @property
    def dropped_attributes(self) -> int:
        return self._dropped


class LeanSpan(trace.Span, ReadableSpan):
    """A recording span that doubles as the ``ReadableSpan`` span processors receive."""

    def __init__(
        self,
        *,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        resource: Resource,
        scope: InstrumentationScope,
        attributes: types.Attributes,
        links: Sequence[Link],
        limits: SpanLimits,
        processor: SpanProcessor,
        start_time: int | None,
        record_exception: bool,
        set_status_on_exception: bool,
    ) -> None:
        # ReadableSpan's fields, set here rather than through its __init__ (which would build a
        # default Resource for nothing).
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        self._resource = resource
        self._instrumentation_scope = scope
        self._instrumentation_info = None
        self._status = _UNSET
        self._start_time = start_time if start_time is not None else time.time_ns()
        self._end_time: int | None = None
        self._limits = limits
        self._processor = processor
        self._record_exception = record_exception
        self._set_status_on_exception = set_status_on_exception
        self._max_attributes = limits.max_span_attributes
        self._max_length = limits.max_span_attribute_length
        if attributes:
            attrs, self._dropped_attributes = bounded(
                attributes, self._max_attributes, self._max_length
            )
        else:
            attrs, self._dropped_attributes = {}, 0
        self._attrs = attrs
        self._attributes = attrs  # what ReadableSpan's own code reads
        # Lists only once something is added: most spans have no events or links, and every
        # container allocated per request brings the next garbage collection closer.
        self._events: list[Event] | tuple[()] = ()
        self._dropped_events = 0
        self._links: list[Link] | tuple[()] = ()
        self._dropped_links = 0
        for link in links:
            self._add_link(link.context, link.attributes)

    # -- ReadableSpan ---------------------------------------------------------------------

    @property
    def attributes(self) -> types.Attributes:
        return MappingProxyType(self._attrs)

    @property
    def dropped_attributes(self) -> int:
        return self._dropped_attributes

    @property
    def dropped_events(self) -> int:
        return self._dropped_events

    @property
    def dropped_links(self) -> int:
        return self._dropped_links

    # -- trace.Span -----------------------------------------------------------------------

    def get_span_context(self) -> SpanContext:
        return self._context  # type: ignore[return-value]

    def is_recording(self) -> bool:
        return self._end_time is None

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        if self._end_time is not None:
            _log.warning("Setting attribute on ended span.")
            return
        self._dropped_attributes += put(
            self._attrs, key, value, self._max_attributes, self._max_length
        )

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        if self._end_time is not None:
            _log.warning("Setting attribute on ended span.")
            return
        for key, value in attributes.items():
            self._dropped_attributes += put(
                self._attrs, key, value, self._max_attributes, self._max_length
            )

    def add_event(
        self, name: str, attributes: types.Attributes = None, timestamp: int | None = None
    ) -> None:
        if self._end_time is not None:
            _log.warning("Tried calling add_event on an ended span.")
            return
        limits = self._limits
        attrs, dropped = (
            bounded(attributes, limits.max_event_attributes, limits.max_attribute_length)
            if attributes
            else ({}, 0)
        )
        events = self._events
        if isinstance(events, tuple):
            events = self._events = []
        if limits.max_events is not None and len(events) >= limits.max_events:
            if not events:
                self._dropped_events += 1
                return
            del events[0]  # the oldest goes, as with the SDK's BoundedList
            self._dropped_events += 1
        events.append(LeanEvent(name, attrs, dropped, timestamp))

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        if self._end_time is not None:
            _log.warning("Tried calling add_link on an ended span.")
            return
        self._add_link(context, attributes)

    def _add_link(self, context: SpanContext, attributes: types.Attributes) -> None:
        if not (context and (context.is_valid or attributes or context.trace_state)):
            return
        limits = self._limits
        attrs, dropped = (
            bounded(attributes, limits.max_link_attributes, limits.max_attribute_length)
            if attributes
            else ({}, 0)
        )
        link = LeanLink(context, attrs, dropped)
        links = self._links
        if isinstance(links, tuple):
            links = self._links = []
        if limits.max_links is not None and len(links) >= limits.max_links:
            self._dropped_links += 1
            if not links:
                return
            del links[0]
        links.append(link)

    def update_name(self, name: str) -> None:
        if self._end_time is not None:
            _log.warning("Tried calling update_name on an ended span.")
            return
        self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._end_time is not None:
            _log.warning("Tried calling set_status on an ended span.")
            return
        # OK is final, and UNSET never overwrites (the API's rules, as in the SDK).
        if self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is StatusCode.UNSET:
                return
            if description is not None:
                _log.warning(
                    "Description %s ignored. Use either `Status` or `(StatusCode, Description)`",
                    description,
                )
            self._status = status
        elif status is not StatusCode.UNSET:
            self._status = Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        event: dict[str, types.AnyValue] = {
            EXCEPTION_TYPE: qualname if module in ("", "builtins") else f"{module}.{qualname}",
            EXCEPTION_MESSAGE: str(exception),
            EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exception)),
            EXCEPTION_ESCAPED: str(escaped),
        }
        if attributes:
            event.update(attributes)
        self.add_event("exception", event, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end_time is not None:
            _log.warning("Calling end() on an ended span.")
            return
        self._end_time = end_time if end_time is not None else time.time_ns()
        self._processor.on_end(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if exc_val is not None and self._end_time is None:
            if self._record_exception:
                self.record_exception(exc_val, escaped=True)
            if self._set_status_on_exception:
                self.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}"))
        self.end()

    def __repr__(self) -> str:
        return f'LeanSpan(name="{self._name}", context={self._context})'


class _ActiveSpan:
    """``with tracer.start_as_current_span(...) as span``: the span made current for the
    block, exceptions recorded as ``use_span`` does, without a generator per span."""

    __slots__ = ("_end_on_exit", "_record_exception", "_set_status", "_span", "_token")

    def __init__(
        self, span: trace.Span, end_on_exit: bool, record_exception: bool, set_status: bool
    ) -> None:
        self._span = span
        self._end_on_exit = end_on_exit
        self._record_exception = record_exception
        self._set_status = set_status
        self._token: object = None

    def __enter__(self) -> trace.Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        span = self._span
        otel_context.detach(self._token)  # type: ignore[arg-type]
        # Like ``trace.use_span``: errors (Exception, not GeneratorExit/CancelledError) are
        # recorded on the span and make it an error.
        if isinstance(exc_val, Exception) and span.is_recording():
            if self._record_exception:
                span.record_exception(exc_val)
            if self._set_status:
                span.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}"))
        if self._end_on_exit:
            span.end()


def _follows_parent(sampler: Sampler) -> tuple[bool, bool]:
    """Whether ``sampler`` is the SDK's ``ParentBased`` with its standard delegates, i.e. the
    child of a sampled parent is sampled and the child of an unsampled one is dropped —
    (for sampled parents, for unsampled ones). Anything else is asked for every span."""
    if type(sampler) is not ParentBased:
        return False, False

    # ParentBased keeps its delegates in private attributes; if a future SDK renames them,
    # getattr gives None and every span goes through should_sample, which is always right.
    def delegate(name: str) -> object:
        return getattr(sampler, name, None)

    sampled = delegate("_remote_parent_sampled") is ALWAYS_ON and (
        delegate("_local_parent_sampled") is ALWAYS_ON
    )
    unsampled = delegate("_remote_parent_not_sampled") is ALWAYS_OFF and (
        delegate("_local_parent_not_sampled") is ALWAYS_OFF
    )
    return sampled, unsampled


class LeanTracer(trace.Tracer):
    """Makes :class:`LeanSpan` s: the SDK tracer's decisions (sampler, ids, limits), less cost."""

    def __init__(
        self,
        *,
        resource: Resource,
        sampler: Sampler,
        processor: SpanProcessor | None,
        scope: InstrumentationScope,
        limits: SpanLimits | None = None,
        id_generator: IdGenerator | None = None,
    ) -> None:
        """``processor`` None: nothing would receive the spans (no exporter configured), so
        none is recorded; every span still gets real ids and the sampling decision, for
        propagation, log lines and ``x-trace-id``."""
        self.resource = resource
        self.sampler = sampler
        self.processor = processor
        self.scope = scope
        self.limits = limits or SpanLimits()
        self.id_generator = id_generator or RandomIdGenerator()
        self._random_ids = self.id_generator.is_trace_id_random()
        self._follow_sampled, self._follow_unsampled = _follows_parent(sampler)

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        links = links or ()
        parent: SpanContext | None = trace.get_current_span(context).get_span_context()
        if parent is not None and not isinstance(parent, SpanContext):
            raise TypeError("parent_span_context must be a SpanContext or None.")
        sampled: bool
        recording: bool
        trace_state: TraceState | None
        if parent is None or not parent.is_valid:
            parent = None
            trace_id = self.id_generator.generate_trace_id()
            random_ids = self._random_ids
        else:
            trace_id = parent.trace_id
            random_ids = parent.trace_flags.random_trace_id
        if parent is not None and (
            self._follow_sampled if parent.trace_flags.sampled else self._follow_unsampled
        ):
            # A parent-based sampler with its standard delegates: the child does what the
            # parent did (what asking it would answer, three calls deep, for every span).
            sampled = recording = parent.trace_flags.sampled
            trace_state = parent.trace_state
        else:
            decision = self.sampler.should_sample(context, trace_id, name, kind, attributes, links)
            sampled = decision.decision.is_sampled()  # type: ignore[no-untyped-call]
            recording = decision.decision.is_recording()  # type: ignore[no-untyped-call]
            trace_state = decision.trace_state
            attributes = decision.attributes
        if sampled:
            flags = _SAMPLED_RANDOM if random_ids else _SAMPLED
        else:
            flags = _NOT_SAMPLED_RANDOM if random_ids else _NOT_SAMPLED
        span_context = SpanContext(
            trace_id,
            self.id_generator.generate_span_id(),
            is_remote=False,
            trace_flags=flags,
            trace_state=trace_state,
        )
        processor = self.processor
        if not recording or processor is None:
            return trace.NonRecordingSpan(span_context)
        span = LeanSpan(
            name=name,
            context=span_context,
            parent=parent,
            kind=kind,
            resource=self.resource,
            scope=self.scope,
            attributes=attributes,
            links=links,
            limits=self.limits,
            processor=processor,
            start_time=start_time,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        )
        processor.on_start(span, parent_context=context)  # type: ignore[arg-type]
        return span

    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> _ActiveSpan:
        span = self.start_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
        )
        return _ActiveSpan(span, end_on_exit, record_exception, set_status_on_exception)
