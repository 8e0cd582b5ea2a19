"""The router's CPU per request served, end to end: a real router process watching N sim
workers, driven by the edge's own router client (Route, batched outcome reports, the view
refresh) at a steady rate.

    .venv/bin/python -m bench.router_cpu [--workers 2] [--rates 20 200] [--seconds 5]
        [--transports unary stream floor]

Processes: N ``services.worker --engine sim`` (default report and probe intervals: a load
report every 100 ms and a probe every 250 ms per worker, as ``make run`` has them) and one
``services.router`` at its default log level (``info``: the ``route.decided`` line per
request is part of the cost), the tracer and metrics set up as in production with no
exporter. The client is this process: the edge's :class:`ResilientRouter` over
:class:`RouterClient` (``GetView`` every 2 s, outcomes batched every 20 ms), sending
Route requests open loop at ``rate`` per second (half of them a conversation with a session
and prefix hashes, as ``bench.router_rpc`` sends) and a SUCCESS outcome for each decision.
Each rate runs once per transport: ``unary`` (a Route call per request, outcomes in
``ReportOutcomes`` calls), ``stream`` (RouteStream: both as messages on one stream, outcomes
riding with the next request) and ``floor`` (RouteStream with requests that validation
refuses at once: the gRPC and span cost before any routing, the part Python code in the
router cannot remove).

Open loop is the pessimistic case for outcomes: at 20/s the next request comes 50 ms after
an outcome, so each outcome leaves alone when its 20 ms flush is due; an edge in a closed
loop sends the next Route moments after a stream ends, and the outcome rides with it.

The router's CPU time (utime + stime of the process and its threads, from ``/proc``) is read
before and after each phase:

- idle: no requests for ``--seconds``: the background (load reports, probes, view refreshes),
  in µs of CPU per second;
- at each rate: CPU per request, all in (the phase's CPU / requests) and the request's own
  share (the phase's CPU less the idle background for the same time, / requests).

Goal (issue 15): the request's own share <= 300 µs. The machine is shared: compare figures
from one run; the load average is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import uvloop

from bench._cpu import cpu_seconds
from meridian.v1 import router_pb2
from services.common import cli
from services.common.clock import SYSTEM_CLOCK
from services.common.errors import InvalidRequest
from services.edge.counters import EdgeCounters
from services.edge.upstream.resilient_router import ResilientRouter
from services.edge.upstream.router_client import RouterClient
from services.localstack.procs import ManagedProcess

MODEL = "sim-model"
REGIONS = ("seoul", "tokyo", "virginia")
GOAL_US = 300.0


@dataclass(frozen=True, slots=True)
class Phase:
    label: str
    transport: str
    requests: int
    seconds: float
    cpu_s: float
    errors: int


@asynccontextmanager
async def stack(workdir: Path, workers: int, log_level: str) -> AsyncIterator[tuple[int, int]]:
    """N sim workers and a router watching them; yields the router's port and pid."""
    python = sys.executable
    procs: list[ManagedProcess] = []

    def proc(name: str, *argv: str) -> ManagedProcess:
        p = ManagedProcess(
            name=name,
            argv=[python, "-m", *argv, "--ready-file", str(workdir / f"{name}.ready")],
            log_path=workdir / f"{name}.log",
            ready_file=workdir / f"{name}.ready",
        )
        procs.append(p)
        return p

    try:
        addresses = []
        started = []
        for i in range(workers):
            w = proc(
                f"worker-{i}",
                "services.worker",
                "--engine",
                "sim",
                "--model",
                MODEL,
                "--worker-id",
                f"sim-{i}",
                "--region",
                REGIONS[i % len(REGIONS)],
                "--log-level",
                "warning",
            )
            await w.start()
            started.append(w)
        for w in started:
            addresses.append(f"127.0.0.1:{(await w.wait_ready(60))['port']}")
        flags = [f for a in addresses for f in ("--worker", a)]
        router = proc("router", "services.router", "--log-level", log_level, *flags)
        await router.start()
        port = (await router.wait_ready(30))["port"]
        assert router.pid is not None
        yield port, router.pid
    finally:
        for p in reversed(procs):
            await p.stop(grace_s=5)


def route_request(rng: random.Random, k: int) -> router_pb2.RouteRequest:
    req = router_pb2.RouteRequest(
        request_id=f"r{k}",
        model=MODEL,
        tenant_id="bench",
        edge_site="seoul",
        prompt_tokens=rng.randint(50, 2000),
        max_tokens=256,
    )
    if k % 2:  # half the traffic is a conversation with a cached prefix
        conv = rng.randrange(200)
        req.session_id = f"s{conv}"
        req.prefix_hashes.extend(conv * 1000 + b for b in range(8))
    return req


async def drive(
    router: ResilientRouter,
    rate: float,
    seconds: float,
    rng: random.Random,
    *,
    floor: bool = False,
) -> int:
    """Open loop at ``rate`` requests/s for ``seconds``: Route, then a SUCCESS outcome. Returns
    the number of errors. ``floor``: requests without a model, refused at once by validation
    (no decision, no outcome): what a Route costs the router before any routing."""
    errors = 0
    pending: set[asyncio.Task[None]] = set()

    async def one(k: int) -> None:
        nonlocal errors
        request = route_request(rng, k)
        if floor:
            request.model = ""
            with contextlib.suppress(InvalidRequest):
                await router.route(request)
            return
        try:
            result = await router.route(request)
        except Exception as err:  # noqa: BLE001 - counted, the bench goes on
            errors += 1
            if errors == 1:
                print(f"first error at {rate:g}/s: {type(err).__name__}: {err}", flush=True)
            return
        router.report_outcome(
            router_pb2.OutcomeReport(
                decision_id=result.decision_id,
                worker_id=result.candidates[0].worker_id,
                outcome=router_pb2.OUTCOME_SUCCESS,
                ttft_ms=25.0,
                completion_tokens=64,
            )
        )

    loop = asyncio.get_running_loop()
    start = loop.time()
    n = int(rate * seconds)
    for k in range(n):
        delay = start + k / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(k))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending)
    return errors


async def wait_for_workers(client: RouterClient, workers: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        view = await client.get_view()
        if sum(w.healthy for w in view.workers) >= workers:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the router did not see {workers} healthy workers in 30 s")


async def measure(
    port: int, pid: int, workers: int, rates: list[float], transports: list[str], seconds: float
) -> list[Phase]:
    """The idle phase, then each rate with each transport (one client per transport, as one
    edge process would hold: the unary one never opens the stream)."""
    clients = {
        t: RouterClient(f"127.0.0.1:{port}", stream=t != "unary")
        for t in ("stream", "unary", "floor")
    }
    routers = {
        t: ResilientRouter(client=c, clock=SYSTEM_CLOCK, counters=EdgeCounters())
        for t, c in clients.items()
    }
    stop = asyncio.Event()
    # One view refresher, as one edge has (it runs through the idle phase too).
    refresher = asyncio.create_task(routers["stream"].run(stop))
    rng = random.Random(1)
    phases = []
    try:
        await wait_for_workers(clients["stream"], workers)
        for t in transports:  # warm-up: imports, caches, gRPC channels and the stream
            await drive(routers[t], 100, 1, rng, floor=t == "floor")
        await asyncio.sleep(1)
        before = cpu_seconds([pid])
        await asyncio.sleep(seconds)
        phases.append(Phase("idle", "", 0, seconds, cpu_seconds([pid]) - before, 0))
        for rate in rates:
            for t in transports:
                t0 = time.monotonic()
                before = cpu_seconds([pid])
                errors = await drive(routers[t], rate, seconds, rng, floor=t == "floor")
                await asyncio.sleep(0.1)  # the last outcome batch lands
                used = cpu_seconds([pid]) - before
                phases.append(
                    Phase(
                        f"{rate:g}/s", t, int(rate * seconds), time.monotonic() - t0, used, errors
                    )
                )
    finally:
        stop.set()
        await refresher
        for r in routers.values():
            await r.close()
    return phases


async def run(args: argparse.Namespace) -> list[Phase]:
    with tempfile.TemporaryDirectory(prefix="router-cpu-") as tmp:
        async with stack(Path(tmp), args.workers, args.log_level) as (port, pid):
            if args.profile:
                print(f"router pid {pid}: attach py-spy now (waiting 3 s)", flush=True)
                await asyncio.sleep(3)
            return await measure(port, pid, args.workers, args.rates, args.transports, args.seconds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.router_cpu", description=__doc__)
    p.add_argument("--workers", type=cli.integer(1, 64), default=2, help="sim worker processes")
    p.add_argument(
        "--rates", type=cli.finite_float(0, 10_000, low_open=True), nargs="+", default=[20.0, 200.0]
    )
    p.add_argument(
        "--seconds",
        type=cli.finite_float(0, 3600, low_open=True),
        default=5.0,
        help="length of each phase",
    )
    p.add_argument(
        "--transports",
        nargs="+",
        choices=["stream", "unary", "floor"],
        default=["unary", "stream", "floor"],
        help="how the client reaches the router: RouteStream, or unary Route + ReportOutcomes; "
        "floor: RouteStream with requests refused at once (the cost before any routing)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--profile", action="store_true", help="print the router's pid and wait")
    args = p.parse_args(argv)
    if args.workers < 1 or args.seconds <= 0 or any(r <= 0 for r in args.rates):
        p.error("--workers must be >= 1, --seconds and --rates > 0")
    phases = uvloop.run(run(args))
    load = os.getloadavg()[0]
    print(
        f"router CPU per request — Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {load:.2f}; {args.workers} sim workers (report 100 ms, probe 250 ms), "
        f"router log level {args.log_level}, {args.seconds:g} s per phase"
    )
    print()
    idle = phases[0]
    idle_per_s = idle.cpu_s / idle.seconds
    print(f"idle background: {idle_per_s * 1e6:,.0f} µs CPU/s ({idle_per_s * 100:.1f} % of a core)")
    print()
    print(
        f"{'rate':>8} {'transport':>9} {'requests':>9} {'errors':>7} {'all-in µs/req':>14} "
        f"{'own µs/req':>11}"
    )
    worst: float | None = None
    for ph in phases[1:]:
        own = (ph.cpu_s - idle_per_s * ph.seconds) / ph.requests * 1e6
        if ph.transport == "stream":
            worst = own if worst is None else max(worst, own)
        print(
            f"{ph.label:>8} {ph.transport:>9} {ph.requests:>9} {ph.errors:>7} "
            f"{ph.cpu_s / ph.requests * 1e6:>14.0f} {own:>11.0f}"
        )
    print()
    if worst is None:
        print(f"goal: router CPU <= {GOAL_US:.0f} µs per request — not measured (no stream run)")
    else:
        verdict = "met" if worst <= GOAL_US else "NOT met"
        print(
            f"goal: router CPU <= {GOAL_US:.0f} µs per request (stream, own share) — {verdict} "
            f"(worst {worst:.0f} µs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
