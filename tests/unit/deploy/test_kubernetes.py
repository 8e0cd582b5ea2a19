"""The Kubernetes manifests cannot be applied here (no cluster), so they are checked against
the API and the code: ``kubectl kustomize`` renders them, every resource passes the OpenAPI
schemas of a pinned Kubernetes version (kubernetes-validate), every container's args parse
with the service's own parser, probes point at ports and paths the services really serve,
discovery names point at Services that exist, secrets are mounted rather than passed on the
command line, the autoscaler's metric is one the workers export, and the network policies
allow only edge -> workers and edge -> Redis."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest
import yaml

from services.common import metric_names as mn
from services.edge.main import build_parser as edge_parser
from services.router.main import build_parser as router_parser
from services.worker.main import build_parser as worker_parser
from tests.support.inproc import start_edge

K8S = Path(__file__).resolve().parents[3] / "deploy/k8s"
PARSERS = {
    "services.edge": edge_parser,
    "services.router": router_parser,
    "services.worker": worker_parser,
}


def documents() -> list[dict[str, Any]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in documents():
        if doc["kind"] == "Deployment":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                yield doc["metadata"]["name"], c


@pytest.mark.parametrize(
    ("deployment", "container"),
    [(d, c) for d, c in containers() if c["args"][0] in PARSERS],
    ids=lambda v: v if isinstance(v, str) else v["name"],
)
def test_container_args_parse(deployment: str, container: dict[str, Any]) -> None:
    args = [a.replace("$(POD_NAME)", f"{deployment}-abc12") for a in container["args"]]
    PARSERS[args[0]]().parse_args(args[1:])


def test_router_dns_names_are_headless_services_in_the_namespace() -> None:
    services = {d["metadata"]["name"]: d for d in documents() if d["kind"] == "Service"}
    for _, c in containers():
        args = c["args"]
        for i, a in enumerate(args):
            if a == "--worker-dns":
                name = args[i + 1].split(".")[0]
                assert name in services, args[i + 1]
                assert services[name]["spec"].get("clusterIP") == "None"
                assert ".meridian.svc." in args[i + 1]


def test_secrets_are_files_not_flags() -> None:
    for _, c in containers():
        joined = " ".join(c["args"])
        assert "CHANGE-ME" not in joined
        for flag in ("--key-pepper-file", "--admin-token-file"):
            if flag in c["args"]:
                path = c["args"][c["args"].index(flag) + 1]
                mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
                assert any(path.startswith(m) for m in mounts), path


def test_kustomization_lists_existing_files_and_ships_the_default_profile() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for res in kust["resources"]:
        assert (K8S / res).exists(), res
    (gen,) = kust["configMapGenerator"]
    for f in gen["files"]:
        assert (K8S / f).resolve().exists(), f
    router = next(c for _, c in containers() if c["args"][0] == "services.router")
    profile = router["args"][router["args"].index("--profile") + 1]
    assert Path(profile).name == "default.yaml"


# --- checked against the API: rendered by kubectl, validated against the pinned schemas ---

#: The Kubernetes version the manifests are validated against (kubernetes-validate's schemas).
KUBERNETES_VERSION = "1.33.0"
OUTSIDE_KUSTOMIZATION = ("worker-vllm-gpu.yaml", "secret.example.yaml", "metrics/*.yaml")


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and kubectl is missing (.ci/run installs kubernetes-client)")
        pytest.skip("kubectl is not installed (Debian: apt-get install kubernetes-client)")
    return path


def rendered() -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_kubectl_kustomize_renders_every_resource_in_the_namespace() -> None:
    docs = rendered()
    kinds = {d["kind"] for d in docs}
    assert {
        "Namespace",
        "Deployment",
        "Service",
        "ConfigMap",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
    } <= kinds
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "meridian", doc["metadata"]["name"]
    profiles = next(d for d in docs if d["kind"] == "ConfigMap")
    assert profiles["data"]["default.yaml"] == (K8S / "router-profiles/default.yaml").read_text()


def test_every_manifest_passes_the_schemas_of_the_pinned_kubernetes_version() -> None:
    docs = rendered()
    for pattern in OUTSIDE_KUSTOMIZATION:
        for path in sorted(K8S.glob(pattern)):
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {err.message}")


def test_a_schema_violation_is_caught() -> None:
    """The validation above can fail: a misspelt field is refused."""
    bad = yaml.safe_load((K8S / "pdb.yaml").read_text().split("---")[0])
    bad["spec"]["minAvailabel"] = bad["spec"].pop("minAvailable")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_the_router_profile_shipped_to_kubernetes_is_the_routers_default() -> None:
    shipped = (K8S / "router-profiles/default.yaml").read_text()
    assert shipped == (K8S.parent / "router/profiles/default.yaml").read_text()


def _arg(container: dict[str, Any], flag: str) -> str:
    return str(container["args"][container["args"].index(flag) + 1])


def _probe_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert port in named, f"{container['name']}: no container port named {port!r}"
    return int(named[port])


def probes() -> Iterator[tuple[str, dict[str, Any], str, dict[str, Any]]]:
    for deployment, c in containers():
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            if kind in c:
                yield deployment, c, kind, c[kind]


def test_every_meridian_container_has_probes_requests_and_limits() -> None:
    for deployment, c in containers():
        assert "readinessProbe" in c, f"{deployment}/{c['name']}"
        assert "livenessProbe" in c or (c["name"] == "worker" and "gpu" in deployment), c["name"]
        resources = c["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), f"{deployment}/{c['name']}"
        assert resources.get("limits"), f"{deployment}/{c['name']} has no limits"


def test_grpc_probes_point_at_the_port_the_service_listens_on() -> None:
    for deployment, c, kind, probe in probes():
        if "grpc" in probe:
            port = _probe_port(c, probe["grpc"]["port"])
            assert str(port) == _arg(c, "--port"), f"{deployment}/{c['name']}.{kind}"


async def test_http_probes_point_at_paths_the_edge_serves(redis_url: str) -> None:
    """The edge itself answers each probed path (a real edge on a free port; its router is
    absent, which only makes /readyz say 503 — served, not 404)."""
    edge = await start_edge(redis_url=redis_url, router_address="127.0.0.1:1")
    try:
        async with aiohttp.ClientSession() as http:
            for deployment, c, kind, probe in probes():
                if "httpGet" not in probe:
                    continue
                assert c["args"][0] == "services.edge", f"{deployment}/{c['name']}.{kind}"
                port = _probe_port(c, probe["httpGet"]["port"])
                assert str(port) == _arg(c, "--port"), f"{deployment}/{c['name']}.{kind}"
                async with http.get(f"{edge.url}{probe['httpGet']['path']}") as resp:
                    assert resp.status in (200, 503), f"{kind} {probe['httpGet']['path']}"
            async with http.get(f"{edge.url}/not-a-probe-path") as resp:
                assert resp.status == 404  # so the check above can fail
    finally:
        await edge.stop()


def test_edges_spread_over_zones_and_nodes_and_keep_one_replica_in_disruptions() -> None:
    docs = documents()
    edge = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "edge-seoul"
    )
    spread = edge["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {s["topologyKey"] for s in spread} == {
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    }
    labels = edge["spec"]["template"]["metadata"]["labels"]
    for s in spread:
        assert s["labelSelector"]["matchLabels"].items() <= labels.items()
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    for pdb in pdbs:
        selector = pdb["spec"]["selector"]["matchLabels"].items()
        assert any(
            selector <= d["spec"]["template"]["metadata"]["labels"].items() for d in deployments
        ), pdb["metadata"]["name"]


def test_worker_autoscaling_uses_a_metric_the_worker_exports_through_the_adapter_rule() -> None:
    adapter = yaml.safe_load((K8S / "metrics/prometheus-adapter.yaml").read_text())
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    exported = mn.prometheus_name(mn.WORKER_WAITING, "{request}")
    assert rule["seriesQuery"].startswith(exported + "{")
    served = rule["name"]["as"]
    hpas = [d for d in documents() if d["kind"] == "HorizontalPodAutoscaler"]
    workers = {
        d["metadata"]["name"]
        for d in documents()
        if d["kind"] == "Deployment" and d["metadata"].get("labels", {}).get("app") == "worker"
    }
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas} == workers - {"worker-kr-gpu"}
    for hpa in hpas:
        (metric,) = hpa["spec"]["metrics"]
        assert metric["pods"]["metric"]["name"] == served


def test_network_policies_allow_only_edge_to_workers_and_edge_to_redis() -> None:
    policies = {d["metadata"]["name"]: d for d in documents() if d["kind"] == "NetworkPolicy"}
    deny = policies["default-deny"]["spec"]
    assert deny["podSelector"] == {}
    assert set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert all(rule.keys() == {"ports"} for rule in deny["egress"])  # DNS only
    for name, port in (("workers", 50061), ("redis", 6379)):
        ingress = policies[name]["spec"]["ingress"]
        allowed = [r for r in ingress if any(p["port"] == port for p in r["ports"])]
        assert len(allowed) == 1, name
        assert allowed[0]["from"] == [{"podSelector": {"matchLabels": {"app": "edge"}}}], name
    edge_egress = policies["edge"]["spec"]["egress"]
    targets = {
        r["to"][0]["podSelector"]["matchLabels"]["app"]: r["ports"][0]["port"] for r in edge_egress
    }
    assert targets == {"worker": 50061, "redis": 6379}
