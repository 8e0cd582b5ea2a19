"""What an open fleet console costs: edge and router CPU with no console, with idle consoles
(no traffic: the feed sends the view every second), and with consoles watching traffic.

    .venv/bin/python -m bench.console_idle [--seconds 20] [--consoles 1 4] [--rate 20]

Real processes (``LocalStack``: Redis, the three regions of ``make run`` behind their delay
proxies, the router, the edge). Phases, one after the other in the same run so the machine's
noise is shared: *baseline* (nothing open), then each number of *idle* consoles (signed in,
``/console/events`` read as a browser would), then *busy*: the same consoles while chat
requests arrive at ``--rate`` per second (the decisions they see; the edge's chat cost is
in that phase too, so it is printed but is not the console's). CPU is read from
``/proc/<pid>/stat`` (user + system) over each phase, as a share of one core.

It also times, in process, what the pages could add to a chat request: resolving
``POST /v1/chat/completions`` in the edge's route table with and without the web routes
(alternating, 10 × 20,000 lookups each). The chat pipeline itself is the same code either way.

Goal (issue 16): an idle console costs the edge under 1 % of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

import aiohttp

from bench._edge import ONE_CLIENT_EDGE_ARGS
from services.common import cli
from services.localstack.config import load_stack_config
from services.localstack.stack import REPO_ROOT, LocalStack

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def measure(pids: dict[str, int], seconds: float) -> dict[str, float]:
    before = {n: cpu_s(p) for n, p in pids.items()}
    started = time.monotonic()
    await asyncio.sleep(seconds)
    wall = time.monotonic() - started
    return {n: (cpu_s(p) - before[n]) / wall * 100 for n, p in pids.items()}


async def console(http: aiohttp.ClientSession, url: str, received: list[int]) -> None:
    async with http.get(f"{url}/console/events") as resp:
        if resp.status != 200:
            raise RuntimeError(f"/console/events: HTTP {resp.status}")
        async for chunk in resp.content.iter_any():
            received[0] += len(chunk)


async def chat_load(
    http: aiohttp.ClientSession, url: str, key: str, model: str, rate: float
) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        with contextlib.suppress(aiohttp.ClientError):
            async with http.post(
                f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as resp:
                await resp.read()

    try:
        while True:
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(1 / rate)
    finally:
        for t in list(pending):
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def route_lookup_ns() -> dict[str, float]:
    """Median ns to resolve the chat route, with and without the web routes."""
    from aiohttp.test_utils import make_mocked_request

    from services.edge.app import build_app
    from services.edge.server import EdgeConfig, EdgeServer, connect_redis
    from services.edge.tenancy.apikeys import KeyHasher
    from services.edge.upstream.router_client import RouterClient

    config = EdgeConfig(port=0, plain_http=True, admin_port=0, admin_token="x" * 32)
    server = EdgeServer(
        config=config,
        redis=connect_redis("redis://127.0.0.1:1/0"),  # never used: nothing is started
        router=RouterClient("127.0.0.1:1"),
        hasher=KeyHasher(b"p" * 32),
    )
    apps = {"without web routes": build_app(server.deps), "with web routes": server.app}
    request = make_mocked_request("POST", "/v1/chat/completions")
    times: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(10):
        for name, app in apps.items():
            started = time.perf_counter_ns()
            for _ in range(20_000):
                await app.router.resolve(request)
            times[name].append((time.perf_counter_ns() - started) / 20_000)
    await server.router.close()
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


async def main(args: argparse.Namespace) -> None:
    for name, ns in (await route_lookup_ns()).items():
        print(f"chat route lookup {name}: {ns:.0f} ns (median)")
    config = load_stack_config(REPO_ROOT / "deploy/local/stack.yaml")
    run_dir = Path(tempfile.mkdtemp(prefix="meridian-bench-"))
    stack = LocalStack(
        config=config,
        run_dir=run_dir,
        edge_port=0,
        log_level="warning",
        edge_args=ONE_CLIENT_EDGE_ARGS,
    )
    await stack.start()
    assert stack.edge is not None
    assert stack.router is not None
    edge_pid, router_pid = stack.edge.pid, stack.router.pid
    assert edge_pid is not None
    assert router_pid is not None
    pids = {"edge": edge_pid, "router": router_pid}
    url = stack.endpoints.edge_url
    token = (run_dir / "secrets" / "admin-token").read_text().strip()
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.seconds:g} s per phase")
    print(f"{'phase':<22} {'edge % core':>12} {'router % core':>14} {'console B/s':>12}")
    try:
        await asyncio.sleep(2)
        rows = [("baseline (no console)", await measure(pids, args.seconds), 0.0)]
        for n in args.consoles:
            jar = aiohttp.CookieJar(unsafe=True)
            async with aiohttp.ClientSession(cookie_jar=jar) as http:
                async with http.post(
                    f"{url}/console/session", data={"token": token}, allow_redirects=False
                ) as resp:
                    if resp.status != 303 or "denied" in resp.headers.get("Location", ""):
                        raise RuntimeError(f"sign-in failed: HTTP {resp.status}")
                received = [0]
                tasks = [asyncio.create_task(console(http, url, received)) for _ in range(n)]
                await asyncio.sleep(2)  # streams open, upstream feed started
                received[0] = 0
                rows.append(
                    (
                        f"{n} idle console(s)",
                        await measure(pids, args.seconds),
                        received[0] / args.seconds,
                    )
                )
                load = asyncio.create_task(
                    chat_load(http, url, stack.endpoints.demo_key, stack.endpoints.model, args.rate)
                )
                await asyncio.sleep(1)
                received[0] = 0
                rows.append(
                    (
                        f"{n} console(s), {args.rate:g} req/s",
                        await measure(pids, args.seconds),
                        received[0] / args.seconds,
                    )
                )
                load.cancel()
                for t in (load, *tasks):
                    t.cancel()
                await asyncio.gather(load, *tasks, return_exceptions=True)
            await asyncio.sleep(2)
        for name, cpu, rate in rows:
            print(f"{name:<22} {cpu['edge']:>12.2f} {cpu['router']:>14.2f} {rate:>12.0f}")
        base = rows[0][1]
        for name, cpu, _ in rows[1:]:
            if "idle" in name:
                print(
                    f"{name}: edge +{cpu['edge'] - base['edge']:.2f} % of a core, "
                    f"router +{cpu['router'] - base['router']:.2f} % over the baseline"
                )
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    finally:
        await stack.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=cli.finite_float(0, 3600, low_open=True), default=20.0)
    parser.add_argument("--consoles", type=cli.integer(1, 256), nargs="+", default=[1, 4])
    parser.add_argument("--rate", type=cli.finite_float(0, 10_000, low_open=True), default=20.0)
    asyncio.run(main(parser.parse_args()))
