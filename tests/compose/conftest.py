"""The compose stack on a real Docker engine, shared by this folder's tests (one build, one
``up`` per session). Without an engine the tests say why and skip; in CI (``CI=true``) they
fail instead: CI must run them (.ci/run installs docker.io and debootstrap)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from services.common.net import free_port
from services.localstack.compose.engine import Engine, EngineUnavailable, find_engine
from services.localstack.compose.stack import REPO, ComposeStack, base_images
from services.localstack.compose.standin import default_cache_dir, ensure_base_images

CHAOS_OVERLAY = REPO / "deploy/compose/chaos.yml"


@dataclass
class Running:
    stack: ComposeStack
    key: str
    debug_url: str
    timings: dict[str, float]


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    try:
        found = find_engine(state_dir=REPO / "build/docker")
    except EngineUnavailable as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and no Docker engine: {err}")
        pytest.skip(f"compose tests need a Docker engine: {err}")
    yield found
    found.close()


@pytest.fixture(scope="session")
def compose_stack(engine: Engine) -> Iterator[Running]:
    timings: dict[str, float] = {}
    start = time.monotonic()
    tags = base_images(REPO / "deploy/docker/Dockerfile", REPO / "docker-compose.yml")
    how = ensure_base_images(engine.client, tags, cache_dir=default_cache_dir())
    timings["base images"] = time.monotonic() - start
    debug_port = free_port()
    stack = ComposeStack(
        engine,
        edge_port=free_port(),
        extra_files=[CHAOS_OVERLAY],
        env={"ROUTER_DEBUG_PORT": str(debug_port)},
    )
    timings["build"] = stack.build()
    try:
        timings["up (until healthy)"] = stack.up()
        stack.keys("tenant", "create", "ci")
        out = stack.keys("key", "create", "ci")
        key = str(json.loads(out[out.index("{") : out.rindex("}") + 1])["key"])
        yield Running(stack, key, f"http://127.0.0.1:{debug_port}", timings)
    finally:
        began = time.monotonic()
        stack.down()
        timings["down"] = time.monotonic() - began
        left = stack.leftovers()
        print(
            f"\ncompose: base images {how}; "
            + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
        )
        assert not left, f"docker compose down left {left}"
