"""The Kubernetes manifests cannot be applied here (no cluster), so they are checked: every
container's args parse with the service's own parser, discovery names point at Services that
exist, secrets are mounted rather than passed on the command line, and the router's profile
is the file the kustomization ships."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.edge.main import build_parser as edge_parser
from services.router.main import build_parser as router_parser
from services.worker.main import build_parser as worker_parser

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
