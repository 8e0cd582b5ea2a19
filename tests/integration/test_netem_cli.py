"""The netem process: argument validation (exit 2, precise messages), the ready file, real
forwarding with the configured delay, and a clean exit on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.netem.cli import parse_args

REPO = Path(__file__).resolve().parents[2]
ROUTE_TAIL = "127.0.0.1:0=127.0.0.1:9,delay_ms=10"


@pytest.mark.parametrize(
    ("routes", "fragment"),
    [
        (["kr"], "--route 'kr': route: expected NAME:LISTEN_HOST"),
        (["kr:127.0.0.1:0=127.0.0.1:9,delay_ms=-3"], "route[kr].delay_ms must be a finite"),
        (["kr:127.0.0.1:0=127.0.0.1:9"], "route[kr].delay_ms: missing"),
        (["kr:127.0.0.1:x=127.0.0.1:9,delay_ms=1"], "route[kr].listen_port: not an integer"),
        (["kr:127.0.0.1:0=127.0.0.1:9,delay_ms=1,loss=2"], "route[kr].loss must be within"),
        (["kr:127.0.0.1:0=127.0.0.1:9,delay_ms=1,mtu=9"], "route[kr].mtu: unknown key"),
        ([f"kr:{ROUTE_TAIL}", f"kr:{ROUTE_TAIL}"], "route[kr]: name used twice"),
        (
            ["a:127.0.0.1:7000=127.0.0.1:9,delay_ms=1", "b:127.0.0.1:7000=127.0.0.1:9,delay_ms=1"],
            "route[b].listen: 127.0.0.1:7000 already used by route[a]",
        ),
    ],
)
def test_bad_routes_exit_2_naming_the_route_and_key(
    routes: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [arg for route in routes for arg in ("--route", route)]
    with pytest.raises(SystemExit) as caught:
        parse_args(argv)
    assert caught.value.code == 2
    assert fragment in capsys.readouterr().err


def test_at_least_one_route_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_args([])
    assert caught.value.code == 2
    assert "--route" in capsys.readouterr().err


def test_a_ready_file_in_a_missing_directory_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(
            ["--route", "127.0.0.1:0=127.0.0.1:1", "--ready-file", str(tmp_path / "no" / "r.json")]
        )
    assert exited.value.code == 2
    assert "--ready-file" in capsys.readouterr().err


def test_routes_on_port_zero_may_share_a_host() -> None:
    options = parse_args(["--route", f"a:{ROUTE_TAIL}", "--route", f"b:{ROUTE_TAIL}"])
    assert [r.name for r in options.routes] == ["a", "b"]


async def start_netem(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.netem",
        *args,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@pytest.mark.parametrize(
    ("option", "shown"), [("delay_ms=-1", b"-1.0"), ("delay_ms=1e12", b"1000000000000.0")]
)
async def test_the_process_exits_2_on_a_delay_out_of_bounds(option: str, shown: bytes) -> None:
    proc = await start_netem("--route", f"kr:127.0.0.1:0=127.0.0.1:9,{option}")
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert b"route[kr].delay_ms must be a finite number >= 0 and <= 60000, got " + shown in err


async def test_the_process_exits_1_when_a_listen_address_is_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await start_netem("--route", f"kr:127.0.0.1:{port}=127.0.0.1:9,delay_ms=1")
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    assert b"netem.bind_failed" in err


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def wait_for_file(path: Path, proc: asyncio.subprocess.Process) -> dict[str, object]:
    deadline = time.monotonic() + 30
    while True:
        try:
            text = await asyncio.to_thread(path.read_text)
        except FileNotFoundError:
            assert proc.returncode is None, "netem exited before it was ready"
            assert time.monotonic() < deadline, "no ready file within 30 s"
            await asyncio.sleep(0.05)
            continue
        loaded: dict[str, object] = json.loads(text)
        return loaded


async def test_the_process_writes_its_ready_file_forwards_and_exits_cleanly_on_sigterm(
    tmp_path: Path,
) -> None:
    ready = tmp_path / "netem.json"
    async with echo_server() as upstream_port:
        proc = await start_netem(
            "--route",
            f"near:127.0.0.1:0=127.0.0.1:{upstream_port},delay_ms=5",
            "--route",
            f"far:127.0.0.1:0=127.0.0.1:{upstream_port},delay_ms=80,jitter_ms=1,seed=3",
            "--ready-file",
            str(ready),
        )
        try:
            info = await wait_for_file(ready, proc)
            assert info["pid"] == proc.pid
            routes = info["routes"]
            assert isinstance(routes, dict)
            assert set(routes) == {"near", "far"}
            far = routes["far"]
            assert far["host"] == "127.0.0.1"
            assert far["port"] > 0

            reader, writer = await asyncio.open_connection(far["host"], far["port"])
            start = time.monotonic()
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), 10) == b"ping"
            assert time.monotonic() - start >= 2 * (0.080 - 0.001)
            writer.close()
        finally:
            if proc.returncode is None:
                os.kill(proc.pid, signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    events = [json.loads(line)["event"] for line in err.decode().splitlines() if line]
    assert events.count("netem.listening") == 2
    assert "netem.stopping" in events
