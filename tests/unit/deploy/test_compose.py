"""docker-compose.yml cannot run here (no Docker engine), so its commands are checked against
the services' own argument parsers: a renamed flag fails this test, not a user's deploy."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.edge.main import build_parser as edge_parser
from services.router.main import build_parser as router_parser
from services.worker.main import build_parser as worker_parser

REPO = Path(__file__).resolve().parents[3]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
OVERLAYS = {p.name: yaml.safe_load(p.read_text()) for p in (REPO / "deploy/compose").glob("*.yml")}


def _netem_parser() -> argparse.ArgumentParser:
    from services.netem.cli import build_parser

    return build_parser()


def _devca_parser() -> argparse.ArgumentParser:
    from services.common.devca import build_parser

    return build_parser()


PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "services.common.devca": _devca_parser,
    "services.edge": edge_parser,
    "services.router": router_parser,
    "services.worker": worker_parser,
    "services.netem": _netem_parser,
}


def interpolated(value: object) -> str:
    """``value`` as compose passes it with the variables unset: ``${NAME:-default}`` is its
    default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))


def meridian_services() -> list[tuple[str, list[str]]]:
    out = []
    for source, spec in [("docker-compose.yml", COMPOSE), *OVERLAYS.items()]:
        for name, svc in spec["services"].items():
            command: list[Any] = svc.get("command", [])
            if command and str(command[0]) in PARSERS:
                out.append((f"{source}:{name}", [interpolated(c) for c in command]))
    return out


def test_the_chaos_overlay_keeps_the_routers_command_and_adds_its_debug_endpoint() -> None:
    base = COMPOSE["services"]["router"]["command"]
    overlay = OVERLAYS["chaos.yml"]["services"]["router"]["command"]
    assert overlay[: len(base)] == base
    assert overlay[len(base) :] == ["--debug-host", "0.0.0.0", "--debug-port", "9151"]


CERTS_DONE = {"condition": "service_completed_successfully"}


def test_every_service_has_a_health_check_and_waits_for_what_it_needs() -> None:
    core = {n: s for n, s in COMPOSE["services"].items() if not s.get("profiles")}
    for name, svc in core.items():
        if svc.get("restart") == "no":  # a one-shot: the others wait for it to complete
            continue
        assert svc.get("healthcheck", {}).get("test"), name
    edge = COMPOSE["services"]["edge"]["depends_on"]
    assert edge == {
        "certs": CERTS_DONE,
        "redis": {"condition": "service_healthy"},
        "router": {"condition": "service_healthy"},
    }
    assert COMPOSE["services"]["router"]["depends_on"] == {
        "certs": CERTS_DONE,
        "netem": {"condition": "service_healthy"},
    }


def _flag(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def test_every_grpc_hop_is_mutual_tls_with_the_files_the_certs_service_writes() -> None:
    certs = COMPOSE["services"]["certs"]["command"]
    names = {certs[i + 1] for i, a in enumerate(certs) if a == "--name"}
    hosts = {certs[i + 1] for i, a in enumerate(certs) if a == "--host"}
    assert "--keep-existing" in certs
    assert {"router", "netem", "127.0.0.1"} <= hosts  # what the services and checks dial
    grpc_services = [
        (n, s)
        for n, s in COMPOSE["services"].items()
        if str(s.get("command", [""])[0]) in ("services.edge", "services.router", "services.worker")
    ]
    assert len(grpc_services) == 6
    for name, svc in grpc_services:
        check = svc["healthcheck"]["test"]
        for command in (svc["command"], check) if "grpc" in check else (svc["command"],):
            cert, key = _flag(command, "--grpc-tls-cert"), _flag(command, "--grpc-tls-key")
            assert _flag(command, "--grpc-tls-ca") == "/certs/ca.crt", name
            assert cert is not None, name
            assert key is not None, name
            role = cert.removeprefix("/certs/").removesuffix(".crt")
            assert role in names, name
            assert key == f"/certs/{role}.key", name
        assert svc["depends_on"]["certs"] == CERTS_DONE, name
        assert "grpc-certs:/certs:ro" in svc["volumes"], name
    router_chaos = OVERLAYS["chaos.yml"]["services"]["router"]["command"]
    assert _flag(router_chaos, "--grpc-tls-cert") == "/certs/router.crt"


@pytest.mark.parametrize("name", [n for n, s in COMPOSE["services"].items() if "healthcheck" in s])
def test_health_checks_parse_with_the_health_check_tool(name: str) -> None:
    from services.common.healthcheck import build_parser as health_parser

    test = COMPOSE["services"][name]["healthcheck"]["test"]
    if test[1:4] == ["python", "-m", "services.common.healthcheck"]:
        health_parser().parse_args(test[4:])
    else:
        assert test[1] == "redis-cli", test


def test_the_operators_view_is_its_own_profile() -> None:
    for name in ("otel-collector", "jaeger", "prometheus", "grafana"):
        assert COMPOSE["services"][name]["profiles"] == ["observability"], name


@pytest.mark.parametrize(("name", "command"), meridian_services())
def test_every_compose_command_parses(name: str, command: list[str]) -> None:
    module, args = command[0], command[1:]
    PARSERS[module]().parse_args(args)


def test_router_watches_every_netem_route() -> None:
    netem = COMPOSE["services"]["netem"]["command"]
    routes = [netem[i + 1] for i, a in enumerate(netem) if a == "--route"]
    ports = {r.split("=")[0].rsplit(":", 1)[1] for r in routes}
    router = COMPOSE["services"]["router"]["command"]
    watched = {router[i + 1].split(":")[1] for i, a in enumerate(router) if a == "--worker"}
    assert watched == ports


def test_the_edge_is_published_on_localhost_only() -> None:
    assert COMPOSE["services"]["edge"]["ports"] == ["127.0.0.1:${EDGE_PORT:-8080}:8080"]


@pytest.mark.parametrize("dockerfile", sorted((REPO / "deploy/docker").glob("Dockerfile*")))
def test_dockerfiles_copy_paths_that_exist(dockerfile: Path) -> None:
    lines = dockerfile.read_text().splitlines()
    sources = [
        line.split()[1] for line in lines if line.startswith("COPY ") and "--from=" not in line
    ]
    assert sources
    for src in sources:
        assert (REPO / src).exists(), src
