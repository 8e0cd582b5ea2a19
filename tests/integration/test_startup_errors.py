"""A port already taken is the commonest start-up failure an operator meets. Every listener of
every service reports it as one line naming the port and what it was for, and exits with
status 1 — no traceback, nothing left running."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.localstack.stack import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def cases(port: int, pepper: Path) -> dict[str, tuple[list[str], str]]:
    edge = [
        "services.edge",
        "--plain-http",
        "--redis-url",
        "redis://127.0.0.1:1",
        "--router",
        "127.0.0.1:1",
        "--key-pepper-file",
        str(pepper),
    ]
    router = ["services.router", "--worker", "127.0.0.1:1", "--port", "0"]
    worker = ["services.worker", "--worker-id", "w1", "--region", "kr", "--port", "0"]
    return {
        "edge public": ([*edge, "--port", str(port)], "the public API"),
        "edge admin": (
            [*edge, "--port", "0", "--admin-port", str(port), "--admin-token-file", str(pepper)],
            "the admin API",
        ),
        "edge metrics": ([*edge, "--port", "0", "--metrics-port", str(port)], "metrics"),
        "router grpc": ([*router[:-1], str(port)], "the router's gRPC API"),
        "router debug": ([*router, "--debug-port", str(port)], "the debug endpoint"),
        "router metrics": ([*router, "--metrics-port", str(port)], "metrics"),
        "worker grpc": ([*worker[:-1], str(port)], "the worker's gRPC API"),
        "worker metrics": ([*worker, "--metrics-port", str(port)], "metrics"),
    }


async def run(argv: list[str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        *argv,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    except TimeoutError:
        proc.kill()
        raise AssertionError(f"{argv[0]} kept running with its port taken") from None
    assert proc.returncode is not None
    return proc.returncode, (out + err).decode()


async def test_every_listener_reports_a_taken_port_in_one_line(
    taken_port: int, tmp_path: Path
) -> None:
    pepper = tmp_path / "secret"
    pepper.write_text("p" * 32 + "\n")
    named = cases(taken_port, pepper)
    results = await asyncio.gather(*(run(argv) for argv, _ in named.values()))
    for (name, (_, what)), (code, output) in zip(named.items(), results, strict=True):
        assert code == 1, (name, output)
        assert "Traceback" not in output, (name, output)
        line = f"error: cannot listen on 127.0.0.1:{taken_port} for {what}"
        assert line in output, (name, output)
