"""``deploy/k8s-grpc-mtls``: the base stack with mutual TLS on every internal hop. Rendered by
``kubectl kustomize`` and checked like the base: the schemas, every container's args through
its service's own parser, and what the overlay adds — the same certificate files mounted and
passed to every service, and probes that can pass (the kubelet's gRPC probe cannot present a
client certificate, so they run the health check with the same flags)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from services.common.healthcheck import build_parser as healthcheck_parser
from tests.unit.deploy.test_kubernetes import KUBERNETES_VERSION, PARSERS, kubectl

OVERLAY = Path(__file__).resolve().parents[3] / "deploy/k8s-grpc-mtls"
SECRET_DIR = "/run/secrets/meridian-grpc-tls"


def rendered() -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(OVERLAY)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def meridian_containers(docs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [
        (doc, c)
        for doc in docs
        if doc["kind"] == "Deployment"
        for c in doc["spec"]["template"]["spec"]["containers"]
        if c["args"][0] in PARSERS
    ]


def test_the_overlay_passes_the_schemas_and_every_service_parses_its_args() -> None:
    docs = rendered()
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {err.message}")
    seen = set()
    for _, c in meridian_containers(docs):
        args = [a.replace("$(POD_NAME)", "pod-abc12") for a in c["args"]]
        parsed = PARSERS[args[0]]().parse_args(args[1:])
        assert parsed.grpc_tls_cert == f"{SECRET_DIR}/tls.crt", c["name"]
        assert parsed.grpc_tls_key == f"{SECRET_DIR}/tls.key", c["name"]
        assert parsed.grpc_tls_ca == f"{SECRET_DIR}/ca.crt", c["name"]
        assert parsed.grpc_tls_server_name == "meridian.internal", c["name"]
        seen.add(args[0])
    assert seen == set(PARSERS)  # edge, router and workers all speak it


def test_every_service_mounts_the_certificate_secret() -> None:
    for doc, c in meridian_containers(rendered()):
        pod = doc["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert SECRET_DIR in mounts, c["name"]
        mount = mounts[SECRET_DIR]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["secret"]["secretName"] == "meridian-grpc-tls"


def test_grpc_servers_are_probed_over_mutual_tls_on_their_own_port() -> None:
    probed = 0
    for _, c in meridian_containers(rendered()):
        if c["args"][0] == "services.edge":
            continue  # HTTP probes on the public port: unchanged
        for kind in ("readinessProbe", "livenessProbe"):
            probe = c[kind]
            assert "grpc" not in probe, f"{c['name']}.{kind}: the kubelet cannot present a cert"
            command = probe["exec"]["command"]
            assert command[:3] == ["python", "-m", "services.common.healthcheck"]
            check = healthcheck_parser().parse_args(command[3:])
            assert check.address == f"127.0.0.1:{c['args'][c['args'].index('--port') + 1]}"
            own = c["args"][c["args"].index("--grpc-tls-cert") :]
            assert command[5:] == own[:8], f"{c['name']}.{kind}: not the service's own files"
            probed += 1
    assert probed == 2 * 3  # router, worker-kr, worker-us
