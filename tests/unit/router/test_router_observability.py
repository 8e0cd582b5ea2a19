import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from services.common import telemetry
from services.router.observability import RouterTelemetry, deciding_signal
from services.router.scheduling.types import (
    Contribution,
    Decision,
    NoCandidate,
    ScoredWorker,
    WorkerSnapshot,
)


def scored(wid: str, region: str, **weighted: float) -> ScoredWorker:
    contributions = tuple(Contribution(k, v, 1.0, v) for k, v in weighted.items())
    return ScoredWorker(WorkerSnapshot(wid, region, "a:1"), sum(weighted.values()), contributions)


def test_the_deciding_signal_is_the_one_that_separated_winner_and_runner_up() -> None:
    # The winner leads mostly on load, though latency is its biggest contribution.
    d = Decision(
        ranked=(
            scored("far", "jp", latency=0.3, load=0.4),
            scored("near", "kr", latency=0.45, load=0.05),
        )
    )
    assert deciding_signal(d) == "load"


def test_a_lone_winner_is_decided_by_its_largest_contribution() -> None:
    assert deciding_signal(Decision(ranked=(scored("a", "kr", latency=0.2, load=0.5),))) == "load"
    assert deciding_signal(Decision(ranked=())) == ""


def test_decisions_become_metrics_and_span_attributes() -> None:
    exporter = InMemorySpanExporter()
    tel = telemetry.setup("router", env={}, span_processors=[SimpleSpanProcessor(exporter)])
    rt = RouterTelemetry(
        tracer=tel.tracer, meter=tel.meter, snapshots=lambda: [WorkerSnapshot("a", "kr", "x:1")]
    )
    won = Decision(
        ranked=(scored("far", "jp", latency=0.3, load=0.4), scored("near", "kr", latency=0.5)),
        plugin_timings_us={"latency": 3.0, "total": 20.0},
    )
    with tel.tracer.start_as_current_span("router.Route") as span:
        rt.record(won, 25.0, span)
    rt.record(
        Decision(ranked=(), empty_reason=NoCandidate.SATURATED), 5.0, tel.tracer.start_span("x")
    )
    (finished,) = [s for s in exporter.get_finished_spans() if s.name == "router.Route"]
    attributes = finished.attributes
    assert attributes is not None
    assert attributes["meridian.region"] == "jp"
    assert attributes["meridian.signal"] == "load"
    assert attributes["meridian.score.latency"] == 0.3
    assert attributes["meridian.runners_up"] == ("near@kr:0.500",)
    families = {f.name: f for f in text_string_to_metric_families(tel.prometheus_text().decode())}
    decisions = families["meridian_router_decisions"].samples
    assert any(
        s.labels == {"meridian_region": "jp", "meridian_signal": "load"} and s.value == 1
        for s in decisions
        if s.name.endswith("_total")
    )
    empty = families["meridian_router_empty_decisions"].samples
    assert any(s.labels.get("meridian_reason") == "saturated" for s in empty)
    workers = families["meridian_router_workers"].samples
    assert workers[0].labels["meridian_region"] == "kr"


def test_plugin_costs_are_recorded_for_one_decision_in_n_and_decisions_counted_for_all() -> None:
    tel = telemetry.setup("router", env={})
    rt = RouterTelemetry(tracer=tel.tracer, meter=tel.meter, plugin_sample_every=4)
    won = Decision(
        ranked=(scored("far", "jp", latency=0.3, load=0.4), scored("near", "kr", latency=0.5)),
        plugin_timings_us={"latency": 3.0, "total": 20.0},
    )
    span = tel.tracer.start_span("x")
    for _ in range(9):  # decisions 1, 5 and 9 are sampled
        rt.record(won, 25.0, span)
    families = {f.name: f for f in text_string_to_metric_families(tel.prometheus_text().decode())}
    plugin = families["meridian_router_plugin_duration_microseconds"].samples
    counts = {s.labels["meridian_plugin"]: s.value for s in plugin if s.name.endswith("_count")}
    assert counts == {"latency": 3, "total": 3}
    decisions = families["meridian_router_decisions"].samples
    assert [s.value for s in decisions if s.name.endswith("_total")] == [9]
    cost = families["meridian_router_decision_duration_microseconds"].samples
    assert [s.value for s in cost if s.name.endswith("_count")] == [9]


def test_a_sampling_period_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="plugin_sample_every"):
        RouterTelemetry(plugin_sample_every=0)
