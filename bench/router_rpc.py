"""Cost of one ``Route`` RPC over gRPC on loopback, by worker count (default profile).

    .venv/bin/python -m bench.router_rpc [--workers 10 100 1000] [--calls 3000] [--seed 1]

The router is the real thing — a ``grpc.aio`` server with :class:`RouterService`, the default
scheduling profile and a :class:`Fleet` — in its own process (as in production: the
edge and the router are different processes), fed with real ``LoadReport`` messages for N
synthetic workers instead of N sockets: a background task delivers a fresh report for every
worker once per ``--report-period-ms`` (1 s by default: 1,000 reports/s at 1,000 workers) and
RTT probes at the same pace, so decisions see the churn a live router sees. The client (this
process) calls Route one at a time, as an edge would for sequential requests, and measures the
round trip.

Prints p50/p99 of the round trip, of the router-side decision (``decision_us`` in the
response: validation, fleet snapshot, scheduling, in-flight accounting, journal), and the
gRPC floor on the same channel (a ``ReportOutcome`` whose handler does nothing), which is
what Python gRPC costs before any routing. Goal: RPC p50 <= 0.5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from pathlib import Path

import uvloop

from meridian.v1 import router_pb2, router_pb2_grpc, worker_pb2
from services.common import cli
from services.common.clock import SYSTEM_CLOCK
from services.common.grpcutil import insecure_channel, new_server
from services.router.fleet import Fleet, FleetConfig
from services.router.scheduling.profile import load_profile
from services.router.service import RouterService

PROFILE = Path(__file__).resolve().parents[1] / "deploy/router/profiles/default.yaml"
REGIONS = ("seoul", "tokyo", "singapore", "mumbai", "frankfurt", "london", "virginia", "oregon")
MODEL = "meridian-8b"
TICK_S = 0.01


def address(i: int) -> str:
    return f"10.{i // 250 % 250}.{i % 250}.1:7000"


def load_report(rng: random.Random, i: int, sequence: int) -> worker_pb2.LoadReport:
    region = REGIONS[i % len(REGIONS)]
    running = rng.randint(0, 56)
    r = worker_pb2.LoadReport(
        worker_id=f"w-{region}-{i}",
        region=region,
        sequence=sequence,
        sent_unix_ms=int(time.time() * 1000),
        running=running,
        waiting=rng.choice((0, 0, 0, 2)),
        max_running=64,
        kv_cache_usage=min(1.0, running / 64 + rng.uniform(0, 0.1)),
        tokens_per_second=running * rng.uniform(20, 45),
        prefix_cache_hit_rate=rng.uniform(0, 0.5),
    )
    model = MODEL if i % 10 else "other-70b"  # 90 % serve the benchmarked model
    r.models.add(name=model, state=worker_pb2.MODEL_STATE_READY, max_model_len=8192)
    return r


def populate(fleet: Fleet, n: int, rng: random.Random) -> list[float]:
    """N workers described, reporting and probed, as their watchers would leave them."""
    rtts = []
    for i in range(n):
        addr = address(i)
        fleet.add(addr)
        report = load_report(rng, i, 1)
        fleet.on_describe(
            addr, worker_pb2.WorkerInfo(worker_id=report.worker_id, region=report.region)
        )
        fleet.on_report(addr, report, SYSTEM_CLOCK.monotonic())
        rtt = rng.uniform(1.0, 180.0)
        rtts.append(rtt)
        fleet.on_probe(addr, rtt)
    return rtts


async def feed(
    fleet: Fleet, n: int, rtts: list[float], rng: random.Random, period_s: float
) -> None:
    """Reports and probes for every worker once per ``period_s``, spread over ticks."""
    per_tick = max(1, round(n * TICK_S / period_s))
    sequence = 1
    i = 0
    while True:
        await asyncio.sleep(TICK_S)
        now = SYSTEM_CLOCK.monotonic()
        for _ in range(per_tick):
            sequence += 1
            fleet.on_report(address(i), load_report(rng, i, sequence), now)
            fleet.on_probe(address(i), rtts[i] * rng.uniform(0.95, 1.05))
            i = (i + 1) % n


def serve_process(n: int, seed: int, period_s: float, ports: Queue[int]) -> None:
    async def serve() -> None:
        rng = random.Random(seed)
        # A worker is stale after three missed reports, as with the router's defaults.
        fleet = Fleet(FleetConfig(stale_after_s=3 * period_s))
        rtts = populate(fleet, n, rng)
        service = RouterService(
            fleet=fleet, scheduler=load_profile(PROFILE), clock=SYSTEM_CLOCK, site="bench"
        )
        server = new_server()
        router_pb2_grpc.add_RouterServicer_to_server(service, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        feeder = asyncio.create_task(feed(fleet, n, rtts, rng, period_s))
        ports.put(port)
        try:
            await server.wait_for_termination()
        finally:
            feeder.cancel()

    uvloop.run(serve())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Figures:
    rpc_us: list[float] = field(default_factory=list)
    decision_us: list[float] = field(default_factory=list)
    floor_us: list[float] = field(default_factory=list)  # a no-op RPC on the same channel


async def measure(port: int, calls: int, warmup: int, seed: int) -> Figures:
    rng = random.Random(seed)
    channel = insecure_channel(f"127.0.0.1:{port}")
    stub = router_pb2_grpc.RouterStub(channel)
    out = Figures()
    noop = router_pb2.OutcomeReport(  # valid, for no decision: applied as a no-op
        decision_id="none", worker_id="nobody", outcome=router_pb2.OUTCOME_SUCCESS
    )
    try:
        for k in range(warmup + calls):
            req = router_pb2.RouteRequest(
                request_id=f"b{k}",
                model=MODEL,
                edge_site="seoul",
                prompt_tokens=rng.randint(50, 2000),
                max_tokens=256,
            )
            if k % 2:  # half the traffic is a conversation with a cached prefix
                conv = rng.randrange(200)
                req.session_id = f"s{conv}"
                req.prefix_hashes.extend(conv * 1000 + b for b in range(8))
            t0 = time.perf_counter_ns()
            resp = await stub.Route(req, timeout=5.0)
            elapsed = (time.perf_counter_ns() - t0) / 1000
            if k >= warmup:
                out.rpc_us.append(elapsed)
                out.decision_us.append(resp.decision_us)
            if k % 3 == 0:  # the gRPC floor: an RPC whose handler does nothing
                t0 = time.perf_counter_ns()
                await stub.ReportOutcome(noop, timeout=5.0)
                if k >= warmup:
                    out.floor_us.append((time.perf_counter_ns() - t0) / 1000)
    finally:
        await channel.close()
    return out


def run_one(n: int, calls: int, warmup: int, seed: int, period_s: float) -> Figures:
    ctx = multiprocessing.get_context("spawn")
    ports: Queue[int] = ctx.Queue()
    proc = ctx.Process(target=serve_process, args=(n, seed, period_s, ports), daemon=True)
    proc.start()
    try:
        port = ports.get(timeout=60)
        figures: Figures = uvloop.run(measure(port, calls, warmup, seed))
        return figures
    finally:
        proc.terminate()
        proc.join(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.router_rpc", description=__doc__)
    p.add_argument("--workers", type=cli.positive_int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--calls", type=cli.positive_int, default=3000)
    p.add_argument("--warmup", type=cli.integer(0), default=300)
    p.add_argument("--seed", type=cli.integer(0), default=1)
    p.add_argument(
        "--report-period-ms",
        type=cli.positive_int,
        default=1000,
        help="each worker's load-report period (1000: a large fleet's setting; the CLI "
        "default is 100)",
    )
    args = p.parse_args(argv)
    if any(n < 1 for n in args.workers) or args.calls < 1 or args.warmup < 0:
        p.error("--workers and --calls must be >= 1, --warmup >= 0")
    if args.report_period_ms < 10:
        p.error("--report-period-ms must be >= 10")
    period_s = args.report_period_ms / 1000

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"Route RPC on loopback, default profile — Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {load:.2f}; {args.calls} sequential calls "
        f"after {args.warmup} warm-up, a report and a probe for every worker each "
        f"{period_s:g}s (stale after {3 * period_s:g}s)"
    )
    print()
    print(
        f"{'workers':>8} {'rpc p50 µs':>11} {'rpc p99 µs':>11} {'decision p50':>13} "
        f"{'p99':>8} {'grpc floor p50':>15}"
    )
    worst_p50 = 0.0
    for n in args.workers:
        f = run_one(n, args.calls, args.warmup, args.seed, period_s)
        p50 = statistics.median(f.rpc_us)
        worst_p50 = max(worst_p50, p50)
        print(
            f"{n:>8} {p50:>11.0f} {pct(f.rpc_us, 0.99):>11.0f} "
            f"{statistics.median(f.decision_us):>13.0f} {pct(f.decision_us, 0.99):>8.0f} "
            f"{statistics.median(f.floor_us):>15.0f}"
        )
    print()
    verdict = "met" if worst_p50 <= 500 else "NOT met"
    print(f"goal: Route RPC p50 <= 500 µs at every size — {verdict} (worst p50 {worst_p50:.0f} µs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
