"""The operator's view cannot run here (no Docker engine): its configuration is checked
instead — pipelines complete, scrape targets real, dashboard queries on metrics we export."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from services.common import metric_names as mn
from tests.support.dashboards import DASHBOARD, dashboard_metric_names

REPO = Path(__file__).resolve().parents[3]
OBS = REPO / "deploy/observability"
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_collector_pipelines_use_defined_components() -> None:
    cfg = yaml.safe_load((OBS / "otel-collector.yaml").read_text())
    for name, pipeline in cfg["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in cfg[kind], f"{name}.{kind}: {component} is not defined"
    assert cfg["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    jaeger = cfg["exporters"]["otlp/jaeger"]["endpoint"].split(":")[0]
    assert jaeger in COMPOSE["services"]


def test_services_export_to_the_collector_when_told_to() -> None:
    """The core stack runs without the operator's view: OTLP export is off unless
    MERIDIAN_OTLP_ENDPOINT names the collector, as the file's header says to do."""
    env = COMPOSE["x-otel-env"]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "${MERIDIAN_OTLP_ENDPOINT:-}"
    header = (Path(__file__).resolve().parents[3] / "docker-compose.yml").read_text()
    documented = header.split("MERIDIAN_OTLP_ENDPOINT=", 1)[1].split()[0]
    host = documented.split("//")[1].split(":")[0]
    assert COMPOSE["services"][host]["profiles"] == ["observability"]


def test_prometheus_scrapes_every_service_on_its_metrics_port() -> None:
    cfg = yaml.safe_load((OBS / "prometheus.yml").read_text())
    targets = {
        t
        for job in cfg["scrape_configs"]
        for group in job["static_configs"]
        for t in group["targets"]
    }
    for target in targets:
        host, port = target.split(":")
        assert host in COMPOSE["services"], target
        command = COMPOSE["services"][host].get("command", [])
        if command and command[0].startswith("services."):
            assert command[command.index("--metrics-port") + 1] == port, target
    meridian = {
        name
        for name, svc in COMPOSE["services"].items()
        if svc.get("command")
        and str(svc["command"][0]) in ("services.edge", "services.router", "services.worker")
    }
    assert meridian <= {t.split(":")[0] for t in targets}


def test_grafana_datasources_match_the_dashboard() -> None:
    ds = yaml.safe_load((OBS / "grafana/provisioning/datasources/datasources.yaml").read_text())
    uids = {d["uid"] for d in ds["datasources"]}
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] in uids
        assert panel["targets"], panel["title"]


def test_dashboard_queries_only_metrics_in_the_catalog() -> None:
    catalog = {
        mn.prometheus_name(getattr(mn, const), unit)
        for const, unit in [
            ("TTFT", "s"),
            ("TPOT", "s"),
            ("REQUEST_DURATION", "s"),
            ("TOKEN_USAGE", "{token}"),
            ("EDGE_REQUESTS", "{request}"),
            ("EDGE_REJECTIONS", "{request}"),
            ("EDGE_ACTIVE_STREAMS", "{stream}"),
            ("ROUTER_DECISIONS", "{decision}"),
            ("ROUTER_EMPTY", "{decision}"),
            ("ROUTER_DECISION_DURATION", "us"),
            ("ROUTER_PLUGIN_DURATION", "us"),
            ("WORKER_RUNNING", "{request}"),
            ("WORKER_WAITING", "{request}"),
            ("WORKER_KV_CACHE", "1"),
            ("WORKER_GPU", "1"),
            ("WORKER_QUEUE_TIME", "s"),
            ("WORKER_TOKENS_PER_SECOND", "{token}/s"),
        ]
    }
    catalog |= {f"{n}_total" for n in catalog}
    used = dashboard_metric_names()
    assert used, "the dashboard queries nothing"
    assert used <= catalog, f"not exported by any service: {sorted(used - catalog)}"
