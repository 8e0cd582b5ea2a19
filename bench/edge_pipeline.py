"""The edge pipeline's own cost per request: validate, authenticate, admit, route and settle,
with a real Redis (rate-limit script, key lookups) and a real router (gRPC) watching three
simulated workers — each a separate process, so this process's CPU time is the edge's alone.

    .venv/bin/python -m bench.edge_pipeline [--requests 3000] [--concurrency 32] [--seconds 5]

Prints figures and asserts nothing:

- **latency**, one request at a time: p50/p99/max microseconds of each step — ``validate``
  (parse + checks of a small chat body), ``auth`` (cache hit: the hot path), ``auth_miss``
  (the cache emptied first: a Redis lookup), ``admit`` (one Lua call: key + tenant scopes with
  rpm, tpm and stream limits), ``settle`` (the end-of-request call), ``route`` (the router's
  answer) — and their sum per request;
- **throughput**, ``--concurrency`` requests in flight for ``--seconds``: admitted requests/s
  (wall) and per core (admitted / this process's CPU seconds), for auth + admit + settle and
  for the whole pipeline with routing.

Goal (issue 4): auth + admission ≤ 1 ms p50; ≥ 2,000 admitted requests/s per edge core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

from meridian.v1 import router_pb2
from services.common import cli as flags
from services.edge.openai_types import parse_chat_request
from services.edge.prompt import estimate_prompt_tokens
from services.edge.ratelimit.types import Ask
from services.edge.server import EdgeConfig, EdgeServer, connect_redis
from services.edge.stages.admit import scopes_for
from services.edge.tenancy.apikeys import KeyHasher
from services.edge.tenancy.tenants import Limits, Tenant
from services.edge.upstream.router_client import RouterClient, RouteResult
from services.localstack.procs import ManagedProcess
from services.localstack.redis_server import RedisServer

MODEL = "meridian-sim"
BODY = json.dumps(
    {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is the capital of South Korea?"},
        ],
        "max_tokens": 64,
        "temperature": 0.2,
    }
).encode()
STEPS = ("validate", "auth", "auth_miss", "admit", "settle", "route")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def start_upstreams(run: Path) -> tuple[list[ManagedProcess], str]:
    py = sys.executable
    procs = []
    addresses = []
    for i, region in enumerate(("kr", "jp", "us")):
        ready = run / f"w{i}.ready"
        worker = ManagedProcess(
            name=f"w{i}",
            argv=[py, "-m", "services.worker", "--engine", "sim", "--model", MODEL,
                  "--worker-id", f"{region}-1", "--region", region, "--port", "0",
                  "--ready-file", str(ready), "--log-level", "warning"],
            log_path=run / f"w{i}.log",
            ready_file=ready,
        )  # fmt: skip
        await worker.start()
        procs.append(worker)
    for worker in procs:
        addresses.append(f"127.0.0.1:{(await worker.wait_ready(30))['port']}")
    ready = run / "router.ready"
    args = [py, "-m", "services.router", "--port", "0", "--ready-file", str(ready)]
    for a in addresses:
        args += ["--worker", a]
    router = ManagedProcess(
        name="router", argv=[*args, "--log-level", "warning"], log_path=run / "router.log",
        ready_file=ready,
    )  # fmt: skip
    await router.start()
    procs.append(router)
    address = f"127.0.0.1:{(await router.wait_ready(30))['port']}"
    return procs, address


async def wait_routable(client: RouterClient) -> None:
    for _ in range(200):
        if await client.ready():
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the router never saw a servable model")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="edge-bench-") as tmp:
        run = Path(tmp)
        redis = RedisServer(run_dir=run / "redis")
        await redis.start()
        procs, router_address = await start_upstreams(run)
        edge = EdgeServer(
            config=EdgeConfig(plain_http=True),
            redis=connect_redis(redis.url),
            router=RouterClient(router_address),
            hasher=KeyHasher(b"edge-bench-pepper-000"),
        )
        try:
            await wait_routable(edge.router.client)
            await measure(edge, args)
        finally:
            await edge.stop()
            for proc in procs:
                await proc.stop(grace_s=5)
            await redis.stop()


async def measure(edge: EdgeServer, args: argparse.Namespace) -> None:
    limits = Limits(rpm=10_000_000, tpm=10**12, max_streams=1_000_000)
    await edge.directory.create_tenant(Tenant(tenant_id="bench", limits=limits, key_limits=limits))
    raw, _ = await edge.directory.create_key("bench")
    auth, limiter, router = edge.auth, edge.limiter, edge.router
    principal = await auth.verify(raw)
    scopes = scopes_for(principal)
    samples: dict[str, list[float]] = {s: [] for s in (*STEPS, "auth+admit", "pipeline")}
    counter = 0

    async def timed(step: str, call: Callable[[], Awaitable[object]]) -> object:
        start = time.perf_counter_ns()
        result = await call()
        samples[step].append((time.perf_counter_ns() - start) / 1000)
        return result

    def report(decision: RouteResult) -> None:
        """What the edge does after each attempt (the router's in-flight accounting)."""
        router.report_outcome(
            router_pb2.OutcomeReport(
                decision_id=decision.decision_id,
                worker_id=decision.candidates[0].worker_id,
                outcome=router_pb2.OUTCOME_SUCCESS,
            )
        )

    async def one_pass(route: bool) -> None:
        nonlocal counter
        counter += 1
        rid = f"b{counter}"
        start = time.perf_counter_ns()
        body = parse_chat_request(BODY)
        tokens = estimate_prompt_tokens(body) + (body.effective_max_tokens() or 0)
        await auth.verify(raw)
        lease = await limiter.admit(Ask(rid, tokens, scopes))
        if route:
            decision = await router.route(router_pb2.RouteRequest(request_id=rid, model=MODEL))
            report(decision)
        limiter.settle(lease, tokens // 2)
        samples["pipeline" if route else "auth+admit"].append(
            (time.perf_counter_ns() - start) / 1000
        )

    for i in range(args.requests):
        rid = f"l{i}"
        start = time.perf_counter_ns()
        body = parse_chat_request(BODY)
        tokens = estimate_prompt_tokens(body) + (body.effective_max_tokens() or 0)
        samples["validate"].append((time.perf_counter_ns() - start) / 1000)
        await timed("auth", lambda: auth.verify(raw))
        this = Ask(rid, tokens, scopes)
        lease = await timed("admit", lambda: limiter.admit(this))  # noqa: B023
        decision = await timed("route", lambda: router.route(router_pb2.RouteRequest(model=MODEL)))
        assert isinstance(decision, RouteResult)
        report(decision)
        assert lease is not None
        start = time.perf_counter_ns()
        limiter.settle(lease, tokens // 2)  # type: ignore[arg-type]
        await limiter.close()
        samples["settle"].append((time.perf_counter_ns() - start) / 1000)
        auth.expire_all()
        await timed("auth_miss", lambda: auth.verify(raw))
    await limiter.close()

    print(f"edge pipeline, {args.requests} requests one at a time ({platform.python_version()},"
          f" {platform.machine()}); microseconds")  # fmt: skip
    print(f"  {'step':<11} {'p50':>8} {'p99':>8} {'max':>8}")
    for step in STEPS:
        v = samples[step]
        print(f"  {step:<11} {pct(v, 0.5):8.0f} {pct(v, 0.99):8.0f} {max(v):8.0f}")
    sums = [
        samples["auth"][i] + samples["admit"][i] + samples["settle"][i]
        for i in range(args.requests)
    ]
    total = [s + samples["validate"][i] + samples["route"][i] for i, s in enumerate(sums)]
    print(f"  {'auth+admit+settle':<11} p50 {pct(sums, 0.5):.0f}  p99 {pct(sums, 0.99):.0f}")
    print(
        f"  {'whole (+validate+route)':<11} p50 {pct(total, 0.5):.0f}  p99 {pct(total, 0.99):.0f}"
    )

    for route in (False, True):
        samples["pipeline" if route else "auth+admit"].clear()
        done = 0
        stop_at = time.monotonic() + args.seconds

        async def loop(route: bool = route, stop_at: float = stop_at) -> None:
            nonlocal done
            while time.monotonic() < stop_at:
                await one_pass(route)
                done += 1

        cpu0, wall0 = time.process_time(), time.monotonic()
        await asyncio.gather(*(loop() for _ in range(args.concurrency)))
        await limiter.close()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        label = "validate+auth+admit+route+settle" if route else "validate+auth+admit+settle"
        lat = samples["pipeline" if route else "auth+admit"]
        print(
            f"throughput, {label}, {args.concurrency} in flight: {done / wall:,.0f} admitted/s"
            f" wall, {done / cpu:,.0f} per core (CPU {cpu:.2f}s / wall {wall:.2f}s);"
            f" latency p50 {statistics.median(lat):.0f} us, p99 {pct(lat, 0.99):.0f} us"
        )
    print(f"counters: admitted={edge.counters.admitted} settle_failures="
          f"{edge.counters.settle_failures} limiter_redis_errors="
          f"{edge.counters.limiter_redis_errors}")  # fmt: skip


def cli(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.edge_pipeline", description=__doc__)
    p.add_argument("--requests", type=flags.integer(1, 10_000_000), default=3000)
    p.add_argument("--concurrency", type=flags.integer(1, 10_000), default=32)
    p.add_argument("--seconds", type=flags.finite_float(0, 3600, low_open=True), default=5.0)
    uvloop.run(main(p.parse_args(argv)))


if __name__ == "__main__":
    cli()
