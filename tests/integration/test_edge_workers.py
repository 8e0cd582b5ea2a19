"""``python -m services.edge --workers N``: N real edge processes on one port (SO_REUSEPORT),
against the in-loop router and workers and a real Redis.

Every process serves (its own admin API on ``--admin-port + i`` counts what it completed); a
process killed with SIGKILL is replaced while the others keep serving; SIGTERM drains and
stops them all; a port another program holds fails once, with the usual line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import MODEL, Stack
from tests.support.builders import TEST_ADMIN_TOKEN
from tests.support.inproc import TEST_PEPPER
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

WORKERS = 2


@dataclass
class Edges:
    proc: asyncio.subprocess.Process
    ready: dict[str, Any]
    key: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ready['port']}"

    def child_pids(self) -> set[int]:
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return {int(p) for p in path.read_text().split()}


def edge_argv(stack: Stack, redis_url: str, ready: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "services.edge",
        "--plain-http",
        "--redis-url",
        redis_url,
        "--router",
        stack.router.address,
        "--ready-file",
        str(ready),
        "--drain-grace-s",
        "5",
        *extra,
    ]


def env() -> dict[str, str]:
    """The pepper and the admin token (MERIDIAN_ADMIN_TOKEN) come from the environment."""
    return {
        **os.environ,
        "MERIDIAN_KEY_PEPPER": TEST_PEPPER.decode(),
        "MERIDIAN_ADMIN_TOKEN": TEST_ADMIN_TOKEN,
    }


async def launch(stack: Stack, redis_url: str, tmp_path: Path, *extra: str) -> Edges:
    ready = tmp_path / "edge.ready"
    proc = await asyncio.create_subprocess_exec(
        *edge_argv(stack, redis_url, ready, *extra), env=env()
    )
    try:
        await eventually(lambda: ready.exists() or proc.returncode is not None, timeout_s=60.0)
        assert proc.returncode is None, f"the edge exited with status {proc.returncode}"
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    return Edges(proc, json.loads(ready.read_text()), stack.key)


@pytest.fixture
async def edges(stack: Stack, redis_url: str, tmp_path: Path) -> AsyncIterator[Edges]:
    # Admin port 0: each process picks a free one (a fixed base would need base + i free too;
    # tests/unit/edge/test_supervisor.py checks the offsets).
    running = await launch(
        stack, redis_url, tmp_path, "--port", "0", "--workers", str(WORKERS),
        "--admin-port", "0",
    )  # fmt: skip
    yield running
    if running.proc.returncode is None:
        running.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(running.proc.wait(), 30.0)
        except TimeoutError:
            running.proc.kill()
            await running.proc.wait()


async def chat(http: aiohttp.ClientSession, edges: Edges) -> int:
    async with http.post(
        f"{edges.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {edges.key}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    ) as resp:
        await resp.read()
        return resp.status


def fresh_connections() -> aiohttp.ClientSession:
    """A new connection per request, so the kernel's SO_REUSEPORT hash picks a process each
    time."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def completions_by_process(edges: Edges) -> list[int]:
    out = []
    async with aiohttp.ClientSession() as http:
        for process in edges.ready["processes"]:
            async with http.get(
                f"http://127.0.0.1:{process['admin_port']}/admin/stats",
                headers={"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"},
            ) as resp:
                assert resp.status == 200
                out.append((await resp.json())["counters"]["completions"])
    return out


async def test_every_process_serves_on_the_one_port(edges: Edges) -> None:
    processes = edges.ready["processes"]
    assert len(processes) == WORKERS
    assert len({p["pid"] for p in processes}) == WORKERS
    assert len({p["admin_port"] for p in processes}) == WORKERS  # one admin API each
    async with fresh_connections() as http:
        statuses = await asyncio.gather(*(chat(http, edges) for _ in range(40)))
    assert statuses == [200] * 40
    counts = await completions_by_process(edges)
    assert sum(counts) == 40
    assert all(c > 0 for c in counts), f"a process served nothing: {counts}"


async def test_a_killed_process_is_replaced_and_the_others_keep_serving(edges: Edges) -> None:
    before = edges.child_pids()
    assert len(before) == WORKERS
    victim = next(iter(before))
    os.kill(victim, signal.SIGKILL)
    # Connections the killed process had accepted or queued die with it (a reset, as for any
    # crashed server); once it is gone, its socket has left the port's group and every new
    # connection lands on a living process, before and after the replacement comes up.
    await eventually(lambda: victim not in edges.child_pids(), timeout_s=10.0)
    async with fresh_connections() as http:
        statuses = await asyncio.gather(*(chat(http, edges) for _ in range(10)))
    assert statuses == [200] * 10
    await eventually(
        lambda: len(edges.child_pids()) == WORKERS and victim not in edges.child_pids(),
        timeout_s=30.0,
    )


async def test_sigterm_stops_every_process(edges: Edges) -> None:
    children = edges.child_pids()
    edges.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(edges.proc.wait(), 30.0) == 0
    for pid in children:
        assert _is_gone(pid)
    with pytest.raises(aiohttp.ClientConnectionError):
        async with fresh_connections() as http:
            await chat(http, edges)


def _is_gone(pid: int) -> bool:
    """Exited: no such process, or a zombie waiting for the test runner to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


async def test_a_taken_port_fails_once_with_one_line(
    stack: Stack, redis_url: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = edge_argv(stack, redis_url, tmp_path / "r", "--port", str(port), "--workers", "2")
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env(), stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(proc.communicate(), 30.0)
    assert proc.returncode == 1
    lines = err.decode().strip().splitlines()
    assert lines[-1] == (
        f"python -m services.edge: error: cannot listen on 127.0.0.1:{port} for the public "
        "API: address already in use"
    )
    assert "Traceback" not in err.decode()


async def test_bad_workers_values_are_refused_naming_the_flag(tmp_path: Path) -> None:
    for value in ("0", "-1", "many", "257"):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.edge", "--plain-http", "--redis-url",
            "redis://127.0.0.1:1", "--router", "127.0.0.1:1", "--workers", value,
            env=env(), stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 30.0)
        assert proc.returncode == 2
        assert "argument --workers" in err.decode(), err.decode()
