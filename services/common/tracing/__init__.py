"""Tracing for the request path, cheap enough to run at 100 % sampling.

The OpenTelemetry *API* stays the interface every service codes against (``trace.Tracer``,
``trace.Span``, W3C propagation); what lives here are faster implementations of the two parts
of the Python *SDK* that dominate a traced request's cost:

- :mod:`.tracer` — :class:`LeanTracer` makes spans that are their own ``ReadableSpan`` (the
  SDK copies every span into a new ``ReadableSpan`` when it ends and guards each attribute
  write with a lock), feeding the SDK's own span processors (``BatchSpanProcessor``,
  ``InMemorySpanExporter``…) unchanged;
- :mod:`.otlp_wire` — encodes finished spans straight to the OTLP protobuf wire format, caching
  the bytes of repeated attributes (``meridian.region=kr`` is the same on every span), instead
  of building one protobuf object per field;
- :mod:`.otlp_grpc` — an OTLP/gRPC ``SpanExporter`` sending those bytes through the SDK
  exporter's own channel, TLS, header, retry and back-off handling.

``MERIDIAN_TRACER=sdk`` swaps back to the SDK's ``TracerProvider`` and exporter (see
:func:`services.common.telemetry.setup`). ``bench/telemetry_overhead.py`` measures both.
"""
