"""OpenTelemetry for one service: a tracer and a meter, exported by OTLP and for Prometheus.

Each service builds one :class:`Telemetry` at start-up and passes ``tracer``/``meter`` to the
components that need them (no global providers, so several services can share a test process
and keep separate registries). Configuration follows the standard ``OTEL_*`` variables:

- ``OTEL_SDK_DISABLED=true`` — everything off (no-op tracer and meter; near-zero cost);
- ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` — e.g. ``parentbased_traceidratio`` and
  ``0.1``; ``always_off`` turns tracing off while keeping metrics;
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
  ``…_METRICS_ENDPOINT``) — where OTLP/gRPC goes; unset: no OTLP export;
- ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` — ``none`` stops OTLP export of that
  signal even with an endpoint set (metrics stay on the Prometheus endpoint);
- ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` — resource identity;
- ``OTEL_METRICS_EXEMPLAR_FILTER`` — unset: ``trace_based`` when metrics are exported by
  OTLP, ``always_off`` when only the Prometheus endpoint serves them (it cannot carry
  exemplars, and collecting them costs every measurement);
- ``MERIDIAN_TRACER`` — ``lean`` (default: :mod:`services.common.tracing`, spans cheap enough
  for 100 % sampling) or ``sdk`` (the SDK's own ``TracerProvider`` and OTLP exporter).

A bad value in any of these stops the service at start with one line naming it.

Metrics are always readable on the service's Prometheus endpoint (:func:`metrics_app`).
Histogram buckets suit LLM latencies (the GenAI semantic conventions' advice), set by views.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Handler
from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    AlwaysOnExemplarFilter,
    ExemplarFilter,
    MeterProvider,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, SynchronousMultiSpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from services.common.cli import port
from services.common.httpapp import hide_version_banner
from services.common.startup import StartupError, start_site
from services.common.tracing.tracer import LeanTracer

# Seconds. From the GenAI semantic conventions (gen_ai.server.time_to_first_token).
TTFT_BUCKETS: Sequence[float] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
# Seconds (gen_ai.server.time_per_output_token), with finer steps at the fast end.
TPOT_BUCKETS: Sequence[float] = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
# Seconds (gen_ai.server.request.duration and queue times).
DURATION_BUCKETS: Sequence[float] = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
# Tokens (gen_ai.client.token.usage).
TOKEN_BUCKETS: Sequence[float] = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
)
# Microseconds (router plugin and decision cost).
MICROSECOND_BUCKETS: Sequence[float] = (
    1,
    2,
    5,
    10,
    20,
    50,
    100,
    200,
    500,
    1000,
    2000,
    5000,
    10000,
)

_BUCKETS_BY_NAME: Mapping[str, Sequence[float]] = {
    "gen_ai.server.time_to_first_token": TTFT_BUCKETS,
    "gen_ai.server.time_per_output_token": TPOT_BUCKETS,
    "gen_ai.server.request.duration": DURATION_BUCKETS,
    "gen_ai.client.token.usage": TOKEN_BUCKETS,
    "meridian.*.queue_time": DURATION_BUCKETS,
    "meridian.router.*duration": MICROSECOND_BUCKETS,
}


def _views() -> list[View]:
    return [
        View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(list(b)))
        for name, b in _BUCKETS_BY_NAME.items()
    ]


def _env_flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _exporter_on(env: Mapping[str, str], name: str) -> bool:
    """OTLP export of a signal is on unless its OTEL_*_EXPORTER says otherwise."""
    values = {v.strip().lower() for v in env.get(name, "otlp").split(",")}
    return "otlp" in values


def sampler_from_env(env: Mapping[str, str]) -> Sampler:
    """The OTEL_TRACES_SAMPLER family, parent-based by default (honours an incoming
    ``traceparent``'s sampled flag)."""
    name = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    arg = env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
    try:
        ratio = float(arg)
    except ValueError:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG must be a number, got {arg!r}") from None
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG must be within [0, 1], got {ratio}")
    samplers: dict[str, Sampler] = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": TraceIdRatioBased(ratio),
        "parentbased_always_on": ParentBased(ALWAYS_ON),
        "parentbased_always_off": ParentBased(ALWAYS_OFF),
        "parentbased_traceidratio": ParentBased(TraceIdRatioBased(ratio)),
    }
    if name not in samplers:
        raise ValueError(f"OTEL_TRACES_SAMPLER {name!r} is not one of {sorted(samplers)}")
    return samplers[name]


_EXEMPLAR_FILTERS: Mapping[str, type[ExemplarFilter]] = {
    "trace_based": TraceBasedExemplarFilter,
    "always_on": AlwaysOnExemplarFilter,
    "always_off": AlwaysOffExemplarFilter,
}


def exemplar_filter_from_env(env: Mapping[str, str]) -> str | None:
    """``OTEL_METRICS_EXEMPLAR_FILTER``, checked (None when unset: :func:`setup` decides)."""
    value = env.get("OTEL_METRICS_EXEMPLAR_FILTER", "").strip().lower()
    if not value:
        return None
    if value not in _EXEMPLAR_FILTERS:
        raise ValueError(
            f"OTEL_METRICS_EXEMPLAR_FILTER {value!r} is not one of {sorted(_EXEMPLAR_FILTERS)}"
        )
    return value


TRACER_IMPLEMENTATIONS = ("lean", "sdk")


def check_env(env: Mapping[str, str]) -> None:
    """Refuse bad telemetry settings (``OTEL_TRACES_SAMPLER``, ``MERIDIAN_TRACER``) before a
    service starts anything, so they exit 2 naming the variable, as a bad flag does.
    Raises ValueError."""
    sampler_from_env(env)
    tracer_implementation(env)


def tracer_implementation(env: Mapping[str, str]) -> str:
    """``MERIDIAN_TRACER``: ``lean`` (default, :mod:`services.common.tracing`) or ``sdk`` (the
    OpenTelemetry SDK's ``TracerProvider`` and OTLP exporter, unchanged)."""
    value = env.get("MERIDIAN_TRACER", "lean").strip().lower() or "lean"
    if value not in TRACER_IMPLEMENTATIONS:
        raise ValueError(f"MERIDIAN_TRACER {value!r} is not one of {list(TRACER_IMPLEMENTATIONS)}")
    return value


def _otlp_span_exporter(impl: str, endpoint: str) -> SpanExporter:
    if impl == "sdk":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint)
    from services.common.tracing.otlp_grpc import LeanOtlpSpanExporter

    return LeanOtlpSpanExporter(endpoint=endpoint)


@dataclass
class Telemetry:
    """One service's tracer, meter and Prometheus registry."""

    service: str
    tracer: trace.Tracer
    meter: metrics.Meter
    registry: CollectorRegistry
    tracing_enabled: bool
    _tracer_provider: TracerProvider | None = None
    _span_processor: SpanProcessor | None = None
    _meter_provider: MeterProvider | None = None
    _extra: list[object] = field(default_factory=list)

    def shutdown(self) -> None:
        """Flush and stop exporters (call on graceful shutdown)."""
        if self._tracer_provider is not None:
            self._tracer_provider.shutdown()
        if self._span_processor is not None:
            self._span_processor.shutdown()
        if self._meter_provider is not None:
            self._meter_provider.shutdown()

    def prometheus_text(self) -> bytes:
        return bytes(generate_latest(self.registry))


def setup(
    service: str,
    *,
    env: Mapping[str, str] | None = None,
    span_processors: Sequence[SpanProcessor] = (),
    span_exporter: SpanExporter | None = None,
    metric_readers: Sequence[MetricReader] = (),
    resource_attributes: Mapping[str, str] | None = None,
) -> Telemetry:
    """Build the service's telemetry from ``env`` (default: ``os.environ``).

    ``span_exporter``/``span_processors``/``metric_readers`` add exporters explicitly (tests use
    an in-memory span exporter); OTLP exporters are added when the OTLP endpoint is set.
    """
    env = os.environ if env is None else env
    registry = CollectorRegistry(auto_describe=True)
    if _env_flag(env, "OTEL_SDK_DISABLED"):
        return Telemetry(
            service=service,
            tracer=trace.NoOpTracer(),
            meter=metrics.NoOpMeter(f"meridian.{service}"),
            registry=registry,
            tracing_enabled=False,
        )
    try:
        sampler = sampler_from_env(env)
        impl = tracer_implementation(env)
        exemplar_filter_name = exemplar_filter_from_env(env)
    except ValueError as err:
        raise StartupError(f"telemetry settings: {err}") from None
    attrs = {"service.name": env.get("OTEL_SERVICE_NAME", f"meridian-{service}")}
    attrs.update(resource_attributes or {})
    resource = Resource.create(attrs)  # also reads OTEL_RESOURCE_ATTRIBUTES

    readers: list[MetricReader] = [
        PrometheusMetricReader(registry=registry, scope_info_enabled=False),
        *metric_readers,
    ]
    metrics_endpoint = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if metrics_endpoint and _exporter_on(env, "OTEL_METRICS_EXPORTER"):
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=metrics_endpoint)))
    if exemplar_filter_name is None:
        # Unset: exemplars (a sampled trace id attached to a measurement) only when something
        # exports them. The Prometheus endpoint cannot carry them, and looking for the current
        # span and offering it to a reservoir on every measurement costs the request path.
        exemplar_filter_name = "trace_based" if len(readers) > 1 else "always_off"
    meter_provider = MeterProvider(
        resource=resource,
        metric_readers=readers,
        views=_views(),
        exemplar_filter=_EXEMPLAR_FILTERS[exemplar_filter_name](),
    )

    tracing = sampler is not ALWAYS_OFF
    tracer_provider: TracerProvider | None = None
    tracer: trace.Tracer = trace.NoOpTracer()
    spans: SpanProcessor | None = None
    if tracing:
        processors: list[SpanProcessor] = list(span_processors)
        if span_exporter is not None:
            processors.append(BatchSpanProcessor(span_exporter))
        traces_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        if traces_endpoint and _exporter_on(env, "OTEL_TRACES_EXPORTER"):
            processors.append(BatchSpanProcessor(_otlp_span_exporter(impl, traces_endpoint)))
        scope_name = f"meridian.{service}"
        if impl == "sdk":
            tracer_provider = TracerProvider(resource=resource, sampler=sampler)
            for processor in processors:
                tracer_provider.add_span_processor(processor)
            tracer = tracer_provider.get_tracer(scope_name)
        else:
            if not processors:
                spans = None  # no exporter: spans carry ids and decisions, nothing is recorded
            elif len(processors) == 1:
                spans = processors[0]  # the usual case: one exporter, no fan-out per span
            else:
                spans = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
                for processor in processors:
                    spans.add_span_processor(processor)
            tracer = LeanTracer(
                resource=resource,
                sampler=sampler,
                processor=spans,
                scope=InstrumentationScope(scope_name, "", ""),  # as the SDK names it
            )
    return Telemetry(
        service=service,
        tracer=tracer,
        meter=meter_provider.get_meter(f"meridian.{service}"),
        registry=registry,
        tracing_enabled=tracing,
        _tracer_provider=tracer_provider,
        _span_processor=spans,
        _meter_provider=meter_provider,
    )


def metrics_handler(telemetry: Telemetry) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        return web.Response(
            body=telemetry.prometheus_text(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    return handle


def metrics_app(telemetry: Telemetry) -> web.Application:
    """A tiny app serving ``GET /metrics`` (mounted on a service's metrics port)."""
    app = hide_version_banner(web.Application())
    app.router.add_get("/metrics", metrics_handler(telemetry))
    return app


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """``--metrics-host/--metrics-port``: where this service serves ``GET /metrics``."""
    g = parser.add_argument_group("telemetry (traces and OTLP: standard OTEL_* variables)")
    g.add_argument("--metrics-host", default="127.0.0.1")
    g.add_argument(
        "--metrics-port",
        type=port,
        default=None,
        help="serve Prometheus metrics on this port (0: any free port; default: off)",
    )


async def serve_metrics(telemetry: Telemetry, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start the Prometheus endpoint; returns the runner (to clean up) and the bound port."""
    runner = web.AppRunner(metrics_app(telemetry), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await start_site(site, "metrics", host, port)
    except StartupError:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])
