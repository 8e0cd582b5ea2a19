"""One request, one trace — across real edge, router and worker processes exporting OTLP to a
real receiver — and each service's Prometheus endpoint moving with the traffic."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common import metric_names as mn
from services.localstack.config import load_stack_config, parse_stack_config
from services.localstack.stack import REPO_ROOT, LocalStack
from tests.support.dashboards import dashboard_metric_names
from tests.support.otlp import OtlpReceiver
from tests.support.wait import eventually

pytestmark = pytest.mark.slow
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
async def traced_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[LocalStack, OtlpReceiver]]:
    receiver = OtlpReceiver()
    endpoint = await receiver.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "60000")
        base = load_stack_config(REPO_ROOT / "deploy/local/stack.yaml")
        config = parse_stack_config(
            {
                "site": base.site,
                "model": base.model,
                "regions": {"kr": {"rtt_ms": 4, "workers": 1}, "us": {"rtt_ms": 40, "workers": 1}},
                "sim": {"time_scale": 0.2},
            }
        )
        stack = LocalStack(config=config, run_dir=tmp_path / "run", edge_port=0, log_level="info")
        await stack.start()
        try:
            yield stack, receiver
        finally:
            await stack.stop()
    finally:
        await receiver.stop()


async def chat(stack: LocalStack, *, stream: bool, traceparent: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {stack.endpoints.demo_key}"}
    if traceparent:
        headers["traceparent"] = traceparent
    body = {
        "model": stack.endpoints.model,
        "messages": [{"role": "user", "content": "trace me"}],
        "max_tokens": 6,
        "stream": stream,
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.endpoints.edge_url}/v1/chat/completions", json=body, headers=headers
        ) as resp,
    ):
        await resp.read()
        assert resp.headers.get("x-trace-id")
        return resp.status


async def test_one_request_is_one_trace_across_edge_router_and_worker(
    traced_stack: tuple[LocalStack, OtlpReceiver],
) -> None:
    stack, receiver = traced_stack
    status = await chat(stack, stream=True, traceparent=f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
    assert status == 200

    def names() -> set[str]:
        return {s.name for s in receiver.trace(CLIENT_TRACE)}

    wanted = {
        "POST /v1/chat/completions",
        "edge.route",
        "router.Route",
        "edge.attempt",
        "worker.Generate",
        "edge.authenticate",
        "edge.admit",
    }
    await eventually(lambda: wanted <= names(), timeout_s=15)
    spans = {s.name: s for s in receiver.trace(CLIENT_TRACE)}

    def parent_of(name: str) -> str:
        return spans[name].parent_span_id

    server = spans["POST /v1/chat/completions"]
    assert server.service == "meridian-edge"
    assert server.parent_span_id == CLIENT_SPAN  # the client's traceparent was honoured
    for stage in ("edge.authenticate", "edge.admit", "edge.route", "edge.attempt"):
        assert parent_of(stage) == server.span_id, stage  # siblings under the request
    assert parent_of("router.Route") == spans["edge.route"].span_id
    assert spans["router.Route"].service == "meridian-router"
    assert spans["router.Route"].attributes["meridian.region"] == "kr"
    assert any(k.startswith("meridian.score.") for k in spans["router.Route"].attributes)
    assert parent_of("worker.Generate") == spans["edge.attempt"].span_id
    worker = spans["worker.Generate"]
    assert worker.service == "meridian-worker"
    assert "first_token" in worker.events
    assert "first_token" in spans["edge.attempt"].events
    assert worker.attributes["gen_ai.response.finish_reason"] == "length"
    assert worker.attributes["gen_ai.usage.output_tokens"] == 6


async def test_a_client_that_says_not_sampled_gets_no_spans_recorded_anywhere(
    traced_stack: tuple[LocalStack, OtlpReceiver],
) -> None:
    """An incoming ``traceparent`` with the sampled flag off is honoured on every hop: the edge
    records nothing for it and passes "not sampled" on, so the router and worker record
    nothing either (they are parent-based). A sampled request sent afterwards is the barrier:
    once its spans from all three services have arrived, any earlier span would have too."""
    stack, receiver = traced_stack
    unsampled = "0af7651916cd43dd8448eb211c80319c"
    assert await chat(stack, stream=True, traceparent=f"00-{unsampled}-{CLIENT_SPAN}-00") == 200
    assert await chat(stack, stream=False, traceparent=f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01") == 200

    def services() -> set[str]:
        return {s.service for s in receiver.trace(CLIENT_TRACE)}

    await eventually(
        lambda: {"meridian-edge", "meridian-router", "meridian-worker"} <= services(),
        timeout_s=15,
    )
    assert receiver.trace(unsampled) == []
    # ...and no hop started a trace of its own for it either.
    assert {s.trace_id for s in receiver.spans if s.service != "meridian-edge"} == {CLIENT_TRACE}


async def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        text = await resp.text()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def total(
    samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str
) -> float:
    return sum(
        v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    )


async def test_prometheus_endpoints_move_with_traffic(
    traced_stack: tuple[LocalStack, OtlpReceiver],
) -> None:
    stack, _ = traced_stack
    metrics = stack.endpoints.metrics
    assert {"edge", "router", "kr-1", "us-1"} <= set(metrics)
    ttft = mn.prometheus_name(mn.TTFT, "s")
    before_edge = await scrape(metrics["edge"])
    for _ in range(3):
        assert await chat(stack, stream=False) == 200
    assert await chat(stack, stream=True) == 200
    bad = await asyncio.gather(*(chat_with_bad_key(stack) for _ in range(2)))
    assert bad == [401, 401]
    assert await chat_unknown_model(stack) == 404  # an empty router decision

    edge = await scrape(metrics["edge"])
    assert total(edge, f"{ttft}_count") - total(before_edge, f"{ttft}_count") == 4
    assert total(edge, f"{ttft}_count", meridian_region="kr") >= 4
    assert total(edge, "meridian_edge_requests_total", http_response_status_code="401") >= 2
    assert total(edge, "meridian_edge_rejections_total", meridian_reason="auth_invalid") >= 2
    tokens = mn.prometheus_name(mn.TOKEN_USAGE, "{token}")
    assert total(edge, f"{tokens}_sum", gen_ai_token_type="output") >= 24
    assert mn.prometheus_name(mn.EDGE_LOOP_STALLED, "s", counter=True) in edge

    router = await scrape(metrics["router"])
    assert total(router, "meridian_router_decisions_total", meridian_region="kr") >= 4
    assert total(router, "meridian_router_workers", meridian_region="kr") == 1
    assert total(router, "meridian_router_plugin_duration_microseconds_count") > 0

    worker = await scrape(metrics["kr-1"])
    assert total(worker, f"{ttft}_count") >= 4
    assert (
        total(worker, "meridian_worker_requests_total", gen_ai_response_finish_reason="length") >= 4
    )
    assert total(worker, "meridian_worker_running") == 0
    assert mn.prometheus_name(mn.WORKER_KV_CACHE, "1") in worker


async def test_the_dashboard_queries_metrics_the_services_really_export(
    traced_stack: tuple[LocalStack, OtlpReceiver],
) -> None:
    stack, _ = traced_stack
    assert await chat(stack, stream=True) == 200
    assert await chat_unknown_model(stack) == 404
    exported: set[str] = set()
    for url in stack.endpoints.metrics.values():
        for name in await scrape(url):
            exported.add(name)
            for suffix in ("_bucket", "_count", "_sum"):
                if name.endswith(suffix):
                    exported.add(name[: -len(suffix)])
    missing = dashboard_metric_names() - exported
    assert not missing, f"the Grafana dashboard queries metrics nobody exports: {missing}"


async def chat_unknown_model(stack: LocalStack) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.endpoints.edge_url}/v1/chat/completions",
            json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]},
            headers={"Authorization": f"Bearer {stack.endpoints.demo_key}"},
        ) as resp,
    ):
        return resp.status


async def chat_with_bad_key(stack: LocalStack) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.endpoints.edge_url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            headers={"Authorization": "Bearer mk-" + "Z" * 43},
        ) as resp,
    ):
        return resp.status


async def post_json(
    stack: LocalStack, path: str, body: dict[str, object], traceparent: str
) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {stack.endpoints.demo_key}", "traceparent": traceparent}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{stack.endpoints.edge_url}{path}", json=body, headers=headers) as resp,
    ):
        await resp.read()
        return resp.status, resp.headers.get("x-trace-id", "")


async def test_completions_and_embeddings_have_their_trace_metrics_and_log_lines(
    traced_stack: tuple[LocalStack, OtlpReceiver],
) -> None:
    """Each new endpoint is one trace across the three services (the worker's span named for
    its RPC), moves its metrics (by gen_ai.operation.name) and writes a JSON log line carrying
    the request's trace id."""
    stack, receiver = traced_stack
    completion_trace = "5bf92f3577b34da6a3ce929d0e0e4737"
    embedding_trace = "6bf92f3577b34da6a3ce929d0e0e4738"
    model = stack.endpoints.model
    status, trace_id = await post_json(
        stack,
        "/v1/completions",
        {"model": model, "prompt": "trace me", "max_tokens": 4},
        f"00-{completion_trace}-{CLIENT_SPAN}-01",
    )
    assert (status, trace_id) == (200, completion_trace)
    status, trace_id = await post_json(
        stack,
        "/v1/embeddings",
        {"model": model, "input": ["trace", "me"]},
        f"00-{embedding_trace}-{CLIENT_SPAN}-01",
    )
    assert (status, trace_id) == (200, embedding_trace)

    def names(trace: str) -> set[str]:
        return {s.name for s in receiver.trace(trace)}

    await eventually(
        lambda: (
            {"POST /v1/completions", "router.Route", "edge.attempt", "worker.Generate"}
            <= names(completion_trace)
        ),
        timeout_s=15,
    )
    await eventually(
        lambda: (
            {"POST /v1/embeddings", "router.Route", "edge.attempt", "worker.Embed"}
            <= names(embedding_trace)
        ),
        timeout_s=15,
    )
    embed_span = {s.name: s for s in receiver.trace(embedding_trace)}["worker.Embed"]
    assert embed_span.attributes["gen_ai.operation.name"] == "embeddings"
    assert embed_span.attributes["gen_ai.usage.input_tokens"] > 0

    edge = await scrape(stack.endpoints.metrics["edge"])
    tokens = mn.prometheus_name(mn.TOKEN_USAGE, "{token}")
    assert total(edge, f"{tokens}_count", gen_ai_operation_name="text_completion") >= 1
    assert total(edge, f"{tokens}_count", gen_ai_operation_name="embeddings") >= 1
    workers = [await scrape(url) for name, url in stack.endpoints.metrics.items() if "-" in name]
    embed_duration = mn.prometheus_name(mn.WORKER_EMBED_DURATION, "s")
    assert sum(total(w, f"{embed_duration}_count", meridian_outcome="ok") for w in workers) >= 1

    logs = stack.run_dir / "logs"

    def logged(event_name: str, trace: str) -> bool:
        return any(
            event_name in line and trace in line
            for path in logs.glob("*.log")
            for line in path.read_text(errors="replace").splitlines()
        )

    await eventually(lambda: logged("completion.completed", completion_trace), timeout_s=10)
    await eventually(lambda: logged("embeddings.completed", embedding_trace), timeout_s=10)
    await eventually(lambda: logged("embed.done", embedding_trace), timeout_s=10)
