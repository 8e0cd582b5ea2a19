import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from prometheus_client.parser import text_string_to_metric_families

from services.common import telemetry
from services.common.startup import StartupError
from services.common.tracecontext import extract_headers, extract_metadata, inject_metadata
from services.common.tracing.tracer import LeanTracer


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({}, ParentBased),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
            ParentBased,
        ),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, type(ALWAYS_OFF)),
    ],
)
def test_sampler_comes_from_the_standard_variables(env: dict[str, str], kind: type) -> None:
    assert isinstance(telemetry.sampler_from_env(env), kind)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "not one of"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x"}, "number"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "within"),
    ],
)
def test_bad_sampler_settings_are_clear_errors(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        telemetry.sampler_from_env(env)


def test_disabled_sdk_gives_noop_tracer_and_meter() -> None:
    tel = telemetry.setup("edge", env={"OTEL_SDK_DISABLED": "true"})
    assert not tel.tracing_enabled
    with tel.tracer.start_as_current_span("x") as span:
        assert not span.is_recording()
    tel.meter.create_counter("c").add(1)  # no error, no output
    assert b"c_total" not in tel.prometheus_text()


def test_spans_reach_the_configured_exporter() -> None:
    exporter = InMemorySpanExporter()
    tel = telemetry.setup("router", env={}, span_processors=[SimpleSpanProcessor(exporter)])
    with tel.tracer.start_as_current_span("route") as span:
        span.set_attribute("meridian.region", "kr")
    (finished,) = exporter.get_finished_spans()
    assert finished.name == "route"
    assert finished.resource.attributes["service.name"] == "meridian-router"
    tel.shutdown()


def test_ttft_histogram_uses_llm_buckets_on_the_prometheus_endpoint() -> None:
    tel = telemetry.setup("worker", env={})
    hist = tel.meter.create_histogram("gen_ai.server.time_to_first_token", unit="s")
    hist.record(0.03, {"gen_ai.request.model": "m"})
    families = {f.name: f for f in text_string_to_metric_families(tel.prometheus_text().decode())}
    fam = families["gen_ai_server_time_to_first_token_seconds"]
    bounds = sorted(
        float(s.labels["le"])
        for s in fam.samples
        if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
    )
    assert bounds == list(telemetry.TTFT_BUCKETS)
    count = next(s.value for s in fam.samples if s.name.endswith("_count"))
    assert count == 1
    tel.shutdown()


def test_registries_are_per_service() -> None:
    a = telemetry.setup("edge", env={})
    b = telemetry.setup("router", env={})
    a.meter.create_counter("only.in.edge").add(1)
    assert b"only_in_edge" in a.prometheus_text()
    assert b"only_in_edge" not in b.prometheus_text()


def test_trace_context_round_trips_through_grpc_metadata() -> None:
    exporter = InMemorySpanExporter()
    tel = telemetry.setup("edge", env={}, span_processors=[SimpleSpanProcessor(exporter)])
    with tel.tracer.start_as_current_span("parent") as parent:
        md = inject_metadata()
    assert md
    assert md[0][0] == "traceparent"
    ctx = extract_metadata(md)
    child_parent = trace.get_current_span(ctx).get_span_context()
    assert child_parent.trace_id == parent.get_span_context().trace_id
    assert child_parent.span_id == parent.get_span_context().span_id


def test_incoming_traceparent_header_is_honoured() -> None:
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    ctx = extract_headers({"TraceParent": tp, "Other": "x"})
    sc = trace.get_current_span(ctx).get_span_context()
    assert format(sc.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_no_context_means_no_metadata() -> None:
    assert inject_metadata() == ()


def test_prometheus_names_match_what_the_exporter_writes() -> None:
    from services.common import metric_names as mn

    tel = telemetry.setup("x", env={})
    tel.meter.create_counter(mn.EDGE_REQUESTS, unit="{request}").add(1)
    tel.meter.create_histogram(mn.ROUTER_DECISION_DURATION, unit="us").record(3)
    tel.meter.create_histogram(mn.TTFT, unit="s").record(0.1)
    tel.meter.create_up_down_counter(mn.EDGE_ACTIVE_STREAMS, unit="{stream}").add(1)
    names = {f.name for f in text_string_to_metric_families(tel.prometheus_text().decode())}
    assert mn.prometheus_name(mn.EDGE_REQUESTS, "{request}") in names  # parser drops _total
    assert mn.prometheus_name(mn.ROUTER_DECISION_DURATION, "us") in names
    assert mn.prometheus_name(mn.TTFT, "s") in names
    assert mn.prometheus_name(mn.EDGE_ACTIVE_STREAMS, "{stream}") in names
    assert mn.prometheus_name(mn.EDGE_REQUESTS, "{request}", counter=True).endswith("_total")


def test_the_lean_tracer_is_the_default_and_the_sdk_one_is_a_setting_away() -> None:
    exporter = InMemorySpanExporter()
    lean = telemetry.setup("edge", env={}, span_processors=[SimpleSpanProcessor(exporter)])
    sdk = telemetry.setup(
        "edge", env={"MERIDIAN_TRACER": "sdk"}, span_processors=[SimpleSpanProcessor(exporter)]
    )
    assert isinstance(lean.tracer, LeanTracer)
    assert isinstance(sdk.tracer, SdkTracer)
    for tel in (lean, sdk):
        with tel.tracer.start_as_current_span("s") as span:
            span.set_attribute("meridian.region", "kr")
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["s", "s"]
    assert {s.resource.attributes["service.name"] for s in spans} == {"meridian-edge"}
    assert spans[0].instrumentation_scope == spans[1].instrumentation_scope
    lean.shutdown()
    sdk.shutdown()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MERIDIAN_TRACER": "fast"}, "MERIDIAN_TRACER"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        ({"OTEL_METRICS_EXEMPLAR_FILTER": "some"}, "OTEL_METRICS_EXEMPLAR_FILTER"),
    ],
)
def test_a_bad_telemetry_setting_stops_start_up_with_a_line_naming_it(
    env: dict[str, str], named: str
) -> None:
    with pytest.raises(StartupError, match=f"telemetry settings: {named}"):
        telemetry.setup("edge", env=env)


def exemplars_recorded(env: dict[str, str], readers: list[InMemoryMetricReader]) -> int:
    tel = telemetry.setup("edge", env=env, metric_readers=readers)
    hist = tel.meter.create_histogram("gen_ai.server.time_to_first_token", unit="s")
    with tel.tracer.start_as_current_span("request"):
        hist.record(0.05)
    if not readers:
        # Only Prometheus, which has no exemplars to show: read the provider's choice.
        chosen = tel._meter_provider._sdk_config.exemplar_filter  # type: ignore[union-attr]
        tel.shutdown()
        return 0 if isinstance(chosen, AlwaysOffExemplarFilter) else 1
    data = readers[0].get_metrics_data()
    tel.shutdown()
    assert data is not None
    points = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
    ]
    return sum(len(p.exemplars) for p in points)


def test_exemplars_are_collected_only_where_something_exports_them() -> None:
    assert exemplars_recorded({}, [InMemoryMetricReader()]) == 1  # an exporting reader
    assert exemplars_recorded({}, []) == 0  # Prometheus only: nothing could carry them
    off = {"OTEL_METRICS_EXEMPLAR_FILTER": "always_off"}
    assert exemplars_recorded(off, [InMemoryMetricReader()]) == 0
