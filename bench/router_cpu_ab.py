"""Router CPU per request, paired: two routers from two source trees (a base and a change)
watching the same sim workers, driven in alternating phases by the edge's own client.

    .venv/bin/python -m bench.router_cpu_ab TREE_A TREE_B [--rounds 8] [--phase-s 3]
        [--rate 200] [--transports stream floor]

Why: on a shared machine the load changes faster than one ``bench.router_cpu`` run takes
(~1.5 minutes), so a before/after pair of runs differs by more than a change of 50–100 µs
per request (this session: the same tree measured 530–890 µs "own" at 200/s). Here both
routers live through the same minutes: each phase drives one router at ``--rate`` over
RouteStream (``stream``: decisions and outcomes, as ``bench.router_cpu`` sends them;
``floor``: requests validation refuses at once), the order of A and B alternating per round,
and what the idle router uses meanwhile is its background (load reports, probes, view
refreshes), subtracted from its own phases. Per router and transport it prints the median,
mean and min of the phases' CPU per request (``/proc`` utime + stime of every thread).

Each tree needs its own ``build/gen`` (generated protos) and ``.venv``; the workers and the
client come from this process's tree (run it with TREE_B's ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import uvloop

from bench.router_cpu import MODEL, REGIONS, drive, wait_for_workers
from services.common import cli
from services.common.clock import SYSTEM_CLOCK
from services.edge.counters import EdgeCounters
from services.edge.upstream.resilient_router import ResilientRouter
from services.edge.upstream.router_client import RouterClient

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (the process itself, no children)."""
    ticks = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended between listdir and read
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / _TICK


async def spawn(
    tree: Path, argv: list[str], workdir: Path, name: str
) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    """``python -m argv`` from ``tree`` (its own venv, sources and protos first on the path,
    started in it so nothing of another tree shadows them); waits for its ready file."""
    ready = workdir / f"{name}.ready"
    env = {**os.environ, "PYTHONPATH": f"{tree}:{tree}/build/gen"}
    with (workdir / f"{name}.log").open("w") as log:
        proc = await asyncio.create_subprocess_exec(
            str(tree / ".venv/bin/python"),
            "-m",
            *argv,
            "--ready-file",
            str(ready),
            cwd=tree,
            env=env,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    for _ in range(600):
        if ready.exists():
            return proc, json.loads(ready.read_text())
        if proc.returncode is not None:
            break
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{name} did not start; see {workdir / name}.log")


async def measure(args: argparse.Namespace, workdir: Path, procs: list[Any]) -> int:
    trees = {"A": args.tree_a.resolve(), "B": args.tree_b.resolve()}
    addresses = []
    for i in range(2):
        argv = ["services.worker", "--engine", "sim", "--model", MODEL, "--worker-id"]
        argv += [f"sim-{i}", "--region", REGIONS[i], "--log-level", "warning"]
        proc, info = await spawn(trees["B"], argv, workdir, f"worker-{i}")
        procs.append(proc)
        addresses.append(f"127.0.0.1:{info['port']}")
    flags = [f for a in addresses for f in ("--worker", a)]
    routers: dict[str, tuple[int, int]] = {}
    for name, tree in trees.items():
        argv = ["services.router", "--log-level", "info", *flags]
        proc, info = await spawn(tree, argv, workdir, f"router-{name}")
        procs.append(proc)
        routers[name] = (proc.pid, info["port"])
    clients = {
        (n, t): RouterClient(f"127.0.0.1:{port}", stream=True)
        for n, (_, port) in routers.items()
        for t in args.transports
    }
    edges = {
        k: ResilientRouter(client=c, clock=SYSTEM_CLOCK, counters=EdgeCounters())
        for k, c in clients.items()
    }
    stop = asyncio.Event()
    first = args.transports[0]
    refreshers = [asyncio.create_task(edges[(n, first)].run(stop)) for n in routers]
    rng = random.Random(1)
    loop = asyncio.get_running_loop()
    try:
        for n in routers:
            await wait_for_workers(clients[(n, first)], 2)
        for (_, t), edge in edges.items():  # warm-up: imports, caches, the streams
            await drive(edge, 100, 1, rng, floor=t == "floor")
        await asyncio.sleep(1)
        idle = {n: [0.0, 0.0] for n in routers}  # CPU s, wall s while the other one ran
        phases: list[tuple[str, str, float, float, int]] = []
        errors = dict.fromkeys(edges, 0)
        for r in range(args.rounds):
            order = ("A", "B") if r % 2 == 0 else ("B", "A")
            for t in args.transports:
                for n in order:
                    other = "B" if n == "A" else "A"
                    before = {m: cpu_s(pid) for m, (pid, _) in routers.items()}
                    t0 = loop.time()
                    errors[(n, t)] += await drive(
                        edges[(n, t)], args.rate, args.phase_s, rng, floor=t == "floor"
                    )
                    await asyncio.sleep(0.1)  # the last outcome batch lands
                    wall = loop.time() - t0
                    after = {m: cpu_s(pid) for m, (pid, _) in routers.items()}
                    idle[other][0] += after[other] - before[other]
                    idle[other][1] += wall
                    requests = int(args.rate * args.phase_s)
                    phases.append((n, t, after[n] - before[n], wall, requests))
    finally:
        stop.set()
        for task in refreshers:
            await task
        for edge in edges.values():
            await edge.close()
    background = {n: used / wall for n, (used, wall) in idle.items()}
    print(
        f"load average {os.getloadavg()[0]:.2f}; background A {background['A'] * 1e6:,.0f} "
        f"µs/s, B {background['B'] * 1e6:,.0f} µs/s; {args.rounds} rounds × {args.phase_s:g} s "
        f"at {args.rate:g}/s; A = {trees['A']}, B = {trees['B']}"
    )
    for t in args.transports:
        for n in routers:
            own = [
                (used - background[n] * wall) / requests * 1e6
                for m, tt, used, wall, requests in phases
                if m == n and tt == t
            ]
            print(
                f"{t:>6} {n}: own µs/request median {statistics.median(own):5.0f} "
                f"mean {statistics.mean(own):5.0f} min {min(own):5.0f} "
                f"errors {errors[(n, t)]} [{' '.join(f'{x:.0f}' for x in own)}]"
            )
    return 0


async def run(args: argparse.Namespace) -> int:
    procs: list[asyncio.subprocess.Process] = []
    with tempfile.TemporaryDirectory(prefix="router-cpu-ab-") as tmp:
        try:
            return await measure(args, Path(tmp), procs)
        finally:
            for proc in reversed(procs):
                if proc.returncode is None:
                    proc.terminate()
            for proc in procs:
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.router_cpu_ab", description=__doc__)
    p.add_argument("tree_a", type=Path, help="base source tree (with .venv and build/gen)")
    p.add_argument("tree_b", type=Path, help="changed source tree (with .venv and build/gen)")
    p.add_argument("--rounds", type=cli.integer(1, 1000), default=8)
    p.add_argument(
        "--phase-s",
        type=cli.finite_float(0, 3600, low_open=True),
        default=3.0,
        help="length of each phase",
    )
    p.add_argument(
        "--rate",
        type=cli.finite_float(0, 10_000, low_open=True),
        default=200.0,
        help="requests per second",
    )
    p.add_argument("--transports", nargs="+", choices=["stream", "floor"], default=["stream"])
    args = p.parse_args(argv)
    if args.rounds < 1 or args.phase_s <= 0 or args.rate <= 0:
        p.error("--rounds must be >= 1, --phase-s and --rate > 0")
    code: int = uvloop.run(run(args))
    return code


if __name__ == "__main__":
    sys.exit(main())
