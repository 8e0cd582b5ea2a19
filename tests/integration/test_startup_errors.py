"""A port already taken is the commonest start-up failure an operator meets. Every listener of
every service reports it as one line naming the port and what it was for, and exits with
status 1 — no traceback, nothing left running."""

from __future__ import annotations

import asyncio
import os
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


async def test_a_stack_that_cannot_start_leaves_no_stale_demo_key_or_endpoints(
    taken_port: int, tmp_path: Path
) -> None:
    """``make run`` removes the last run's demo key and stack.json before starting anything,
    so a script waiting for them never reads a previous stack's (here: the edge's port is
    taken, the stack never comes up, and neither file may be left)."""
    (tmp_path / "run").mkdir()
    stale_key, stale_info = tmp_path / "demo-key", tmp_path / "run" / "stack.json"
    stale_key.write_text("mk-stale\n")
    stale_info.write_text('{"edge_url": "http://127.0.0.1:1"}')
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.localstack",
        cwd=REPO_ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
            "EDGE_PORT": str(taken_port),
            "MERIDIAN_STATE_DIR": str(tmp_path),
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 1, out.decode()
    assert f"127.0.0.1:{taken_port}" in out.decode()
    assert not stale_key.exists()
    assert not stale_info.exists()


def test_the_demo_key_is_written_whole_and_private(tmp_path: Path) -> None:
    from services.localstack.main import write_private

    key = tmp_path / "demo-key"
    key.write_text("old")
    write_private(key, "mk-new\n")
    assert key.read_text() == "mk-new\n"
    assert key.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["demo-key"]  # no temp file left


async def test_an_edge_whose_redis_does_not_answer_says_so_once_at_start(tmp_path: Path) -> None:
    """It serves anyway (by its failure mode), but the operator hears of it at once, with the
    address (password masked), not only on the first request's auth.unavailable."""
    import json
    import signal

    pepper = tmp_path / "pepper"
    pepper.write_text("p" * 43)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.edge",
        "--plain-http",
        "--port",
        "0",
        "--redis-url",
        "redis://:hunter2@127.0.0.1:1/0",
        "--router",
        "127.0.0.1:1",
        "--key-pepper-file",
        str(pepper),
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines: list[dict[str, object]] = []
    try:
        async with asyncio.timeout(30):
            while not any(line.get("event") == "edge.redis_unreachable" for line in lines):
                raw = await proc.stderr.readline()
                assert raw, "the edge exited"
                lines.append(json.loads(raw))
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
    (warning,) = [line for line in lines if line.get("event") == "edge.redis_unreachable"]
    assert warning["level"] == "warning"
    assert warning["url"] == "redis://:***@127.0.0.1:1/0"
    assert "hunter2" not in json.dumps(lines)
