"""docker-compose.yml cannot run here (no Docker engine), so its commands are checked against
the services' own argument parsers: a renamed flag fails this test, not a user's deploy."""

from __future__ import annotations

import argparse
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


def _netem_parser() -> argparse.ArgumentParser:
    from services.netem.cli import build_parser

    return build_parser()


PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "services.edge": edge_parser,
    "services.router": router_parser,
    "services.worker": worker_parser,
    "services.netem": _netem_parser,
}


def meridian_services() -> list[tuple[str, list[str]]]:
    out = []
    for name, svc in COMPOSE["services"].items():
        command: list[Any] = svc.get("command", [])
        if command and str(command[0]) in PARSERS:
            out.append((name, [str(c) for c in command]))
    return out


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
    assert COMPOSE["services"]["edge"]["ports"] == ["127.0.0.1:8080:8080"]


@pytest.mark.parametrize("dockerfile", sorted((REPO / "deploy/docker").glob("Dockerfile*")))
def test_dockerfiles_copy_paths_that_exist(dockerfile: Path) -> None:
    lines = dockerfile.read_text().splitlines()
    sources = [line.split()[1] for line in lines if line.startswith("COPY ")]
    assert sources
    for src in sources:
        assert (REPO / src).exists(), src
