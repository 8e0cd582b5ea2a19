"""Meridian's full path against vLLM's own OpenAI server, same engine, same model (prints only).

Two systems, each as real processes on 127.0.0.1, loaded one after the other (never together:
on a 2-core host they would share the cores):

- **meridian**: Redis, one vLLM worker (``python -m services.worker --engine vllm``), the
  router and the edge; the client talks to the edge, which asks the router and streams from
  the worker over gRPC (GenerateMux; ``meridian-call``: one Generate call per stream;
  ``meridian-engine-metrics``: the worker also records vLLM's own Prometheus metrics, which
  ``vllm serve`` records and Meridian's worker leaves off unless ``--engine-metrics``);
- **vllm serve**: ``python -m vllm.entrypoints.openai.api_server``, the server ``vllm serve``
  runs.

Both serve the tiny random-weight Llama (services/worker/vllm/tinymodel.py) with the same engine
settings (those of ``VllmConfig.cpu_test``: float32, 256-token context, 16 sequences, eager,
15 % of host memory for the KV cache, seed 0, prefix caching on). The same client drives both:
``--concurrency`` streams kept busy (closed loop) until ``--requests`` chat completions of
``--tokens`` greedy tokens each (``ignore_eos``) are done, after ``--warmup`` requests that are
not counted. Per request it records the time to the first content chunk (TTFT), the gaps
between content chunks (inter-token latency, ITL) and the completion tokens from the stream's
usage; tokens/s is all completion tokens over the wall time of the measured requests. The
client is a plain aiohttp SSE reader (no SDK), identical for both, so its cost is the same.

Both systems are started (one after the other) and stay up; then ``--pairs`` pairs of runs
alternate the load between them, the order swapped every pair, while the other idles (the CPU
it used meanwhile is printed: an idle vLLM engine waits on its queue). On a shared host the
background load drifts by more than the difference being measured, so a figure from one
system's block of runs against the other's block says more about the host than about the
systems; the per-pair ratios put both under the same conditions, and their median is the
figure the goal is judged on.

    .venv/bin/python -m bench.vllm_vs_serve [--concurrency 8] [--requests 96] [--tokens 128]
        [--pairs 10] [--systems meridian,vllm]

Goal (issue 3): Meridian within 10 % of ``vllm serve`` on tokens/s and within 5 ms on TTFT
p50, at concurrency 8.

CPU per token (issue 15): each run also reads, from /proc, the CPU each of the system's own
processes spent during the run — its *frontend* (HTTP, gRPC, scheduling, detokenising;
Meridian's edge, router and worker processes; ``vllm serve``'s API server) — apart from the
engine-core process each spawned, and prints frontend µs per delivered token, per process,
and the per-pair meridian/vllm ratio. Unlike tokens/s, that ratio does not depend on how many
cores the host has. Goal: ≤ 1 (Meridian's frontend no costlier than vLLM's own server).

The router runs with ``--stale-after-ms 5000`` by default here, not its 600: on the project's
2-core VMs a busy vLLM CPU engine delays the wake-ups of every other process on the machine by
up to seconds (seen with ``vllm serve`` alone: a process sleeping 10 ms in a loop woke up to
1 s late), and with 600 ms the router declares the busy worker down and the edge answers 503.
That is this host, not the serving path being compared; ``--router-stale-after-ms 600`` shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from bench._cpu import cpu_seconds, own_cpu_seconds
from services.common import cli
from services.common.clock import SYSTEM_CLOCK
from services.common.net import free_port
from services.edge.tenancy.apikeys import KeyHasher, load_pepper, new_pepper
from services.edge.tenancy.directory import Directory
from services.edge.tenancy.tenants import Tenant
from services.localstack.procs import ManagedProcess, ProcessFailed
from services.localstack.redis_server import RedisServer
from services.worker.vllm.tinymodel import build_tiny_model

MODEL = "tiny-llama"
PROMPT = [{"role": "user", "content": "Tell me about the edge of the network."}]
ENGINE_FLAGS = [
    "--dtype",
    "float32",
    "--max-model-len",
    "256",
    "--max-num-seqs",
    "16",
    "--gpu-memory-utilization",
    "0.15",
    "--enforce-eager",
]


@dataclass(slots=True)
class RequestRecord:
    ttft_s: float
    gaps_s: list[float]
    tokens: int


@dataclass(slots=True)
class RunResult:
    records: list[RequestRecord] = field(default_factory=list)
    wall_s: float = 0.0
    #: CPU seconds each of the system's processes spent itself during the run (its frontend:
    #: HTTP, gRPC, detokenising; not the engine-core child), and its engine children.
    frontend_cpu_s: dict[str, float] = field(default_factory=dict)
    engine_cpu_s: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.records)

    def frontend_us_per_token(self) -> float:
        return sum(self.frontend_cpu_s.values()) / self.tokens * 1e6 if self.tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.records) / self.wall_s if self.wall_s else 0.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    base_url: str  # ".../v1"
    api_key: str
    pids: tuple[int, ...] = ()  # the system's processes (their children are found in /proc)
    names: tuple[str, ...] = ()  # one per pid: "edge", "router", "worker", "vllm-serve"


# -- the client --------------------------------------------------------------------------------


async def one_request(
    session: aiohttp.ClientSession, endpoint: Endpoint, tokens: int
) -> RequestRecord:
    body = {
        "model": MODEL,
        "messages": PROMPT,
        "max_tokens": tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {endpoint.api_key}"}
    start = time.perf_counter()
    stamps: list[float] = []
    used = 0
    async with session.post(
        f"{endpoint.base_url}/chat/completions", json=body, headers=headers
    ) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if choices and choices[0].get("delta", {}).get("content"):
                stamps.append(time.perf_counter())
            if chunk.get("usage"):
                used = int(chunk["usage"]["completion_tokens"])
    if not stamps:
        raise RuntimeError("the stream carried no content")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return RequestRecord(ttft_s=stamps[0] - start, gaps_s=gaps, tokens=used)


async def closed_loop(
    endpoint: Endpoint, *, concurrency: int, requests: int, tokens: int
) -> RunResult:
    """``concurrency`` streams kept busy until ``requests`` are done."""
    result = RunResult()
    remaining = requests
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def lane() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                result.records.append(await one_request(session, endpoint, tokens))

        start = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - start
    return result


# -- the systems -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def meridian(
    model_dir: Path,
    workdir: Path,
    *,
    stale_after_ms: int,
    worker_transport: str = "mux",
    worker_flags: Sequence[str] = (),
) -> AsyncIterator[Endpoint]:
    """Redis, one vLLM worker, the router and the edge, as ``make run ENGINE=vllm`` starts
    them, minus the delay proxy (no network distance to add here).

    ``stale_after_ms`` is the router's: how old a worker's last load report may be before the
    worker counts as down (see ``--router-stale-after-ms``).
    """
    python = sys.executable
    redis = RedisServer(run_dir=workdir / "redis")
    procs: list[ManagedProcess] = []

    def proc(name: str, module: str, *args: str) -> ManagedProcess:
        ready = workdir / f"{name}.ready"
        p = ManagedProcess(
            name=name,
            argv=[python, "-m", module, "--ready-file", str(ready), "--log-level", "info", *args],
            log_path=workdir / f"{name}.log",
            ready_file=ready,
        )
        procs.append(p)
        return p

    try:
        await redis.start()
        worker = proc(
            "worker",
            "services.worker",
            "--engine",
            "vllm",
            "--model",
            str(model_dir),
            "--served-model-name",
            MODEL,
            "--worker-id",
            "bench-1",
            "--region",
            "local",
            *ENGINE_FLAGS,
            *worker_flags,
        )
        await worker.start()
        w = await worker.wait_ready(180)
        router = proc(
            "router",
            "services.router",
            "--worker",
            f"127.0.0.1:{w['port']}",
            "--stale-after-ms",
            str(stale_after_ms),
        )
        await router.start()
        r = await router.wait_ready(30)
        pepper = workdir / "key-pepper"
        pepper.write_text(new_pepper() + "\n")
        pepper.chmod(0o600)
        edge = proc(
            "edge",
            "services.edge",
            "--port",
            "0",
            "--plain-http",
            "--redis-url",
            redis.url,
            "--router",
            f"127.0.0.1:{r['port']}",
            "--key-pepper-file",
            str(pepper),
            "--worker-transport",
            worker_transport,
        )
        await edge.start()
        e = await edge.wait_ready(30)
        client = aioredis.Redis.from_url(redis.url)
        try:
            hasher = KeyHasher(load_pepper(file=pepper))
            directory = Directory(redis=client, hasher=hasher, clock=SYSTEM_CLOCK)
            await directory.ensure_tenant(Tenant(tenant_id="bench"))
            key, _ = await directory.create_key("bench", name="vllm_vs_serve")
        finally:
            await client.aclose()
        base = f"http://127.0.0.1:{e['port']}"
        await wait_http(f"{base}/readyz", procs, timeout_s=300)
        started = [p for p in procs if p.pid is not None]
        yield Endpoint(
            f"{base}/v1",
            key,
            tuple(p.pid for p in started if p.pid is not None),
            tuple(p.name for p in started),
        )
    finally:
        for p in reversed(procs):
            await p.stop(grace_s=30)
        await redis.stop()


@contextlib.asynccontextmanager
async def vllm_serve(
    model_dir: Path, workdir: Path, *, stale_after_ms: int
) -> AsyncIterator[Endpoint]:
    """vLLM's own OpenAI server with the same engine settings."""
    port = free_port()
    server = ManagedProcess(
        name="vllm-serve",
        argv=[
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--seed",
            "0",
            *ENGINE_FLAGS,
        ],
        log_path=workdir / "vllm-serve.log",
    )
    try:
        await server.start()
        base = f"http://127.0.0.1:{port}"
        await wait_http(f"{base}/v1/models", [server], timeout_s=300)
        pids = (server.pid,) if server.pid is not None else ()
        yield Endpoint(f"{base}/v1", "none", pids, ("vllm-serve",) * len(pids))
    finally:
        await server.stop(grace_s=30)


async def wait_http(url: str, procs: Sequence[ManagedProcess], *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            for p in procs:
                if not p.alive():
                    raise ProcessFailed(f"{p.name} exited:\n{p.log_tail()}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() > deadline:
                raise ProcessFailed(f"{url} not ready after {timeout_s:.0f}s")
            await asyncio.sleep(0.2)


def meridian_call(model_dir: Path, workdir: Path, *, stale_after_ms: int) -> Any:
    """Meridian with one Generate call per stream (``--worker-transport call``)."""
    return meridian(model_dir, workdir, stale_after_ms=stale_after_ms, worker_transport="call")


def meridian_engine_metrics(model_dir: Path, workdir: Path, *, stale_after_ms: int) -> Any:
    """Meridian with vLLM's own Prometheus metrics recorded too (``--engine-metrics``), as
    ``vllm serve`` records them: like for like on the metrics each step pays for."""
    return meridian(
        model_dir, workdir, stale_after_ms=stale_after_ms, worker_flags=("--engine-metrics",)
    )


SYSTEMS = {
    "meridian": meridian,
    "meridian-call": meridian_call,
    "meridian-engine-metrics": meridian_engine_metrics,
    "vllm": vllm_serve,
}
LABELS = {
    "meridian": "meridian",
    "meridian-call": "meridian call",
    "meridian-engine-metrics": "meridian +vllm metrics",
    "vllm": "vllm serve",
}


# -- figures -----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass(frozen=True, slots=True)
class Summary:
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    tokens_per_s: float
    runs_tokens_per_s: tuple[float, ...]
    chunks_per_request: float


def summarize(runs: Sequence[RunResult]) -> Summary:
    """Percentiles over every measured request of every run; tokens/s is the median run's."""
    records = [r for run in runs for r in run.records]
    ttfts = [r.ttft_s * 1000 for r in records]
    gaps = [g * 1000 for r in records for g in r.gaps_s]
    rates = tuple(run.tokens_per_s for run in runs)
    return Summary(
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p99_ms=percentile(ttfts, 99),
        itl_p50_ms=percentile(gaps, 50),
        itl_p99_ms=percentile(gaps, 99),
        tokens_per_s=statistics.median(rates),
        runs_tokens_per_s=rates,
        chunks_per_request=statistics.mean(len(r.gaps_s) + 1 for r in records),
    )


def print_table(results: dict[str, Summary]) -> None:
    names = list(results)
    rows = [
        ("TTFT p50 (ms)", "ttft_p50_ms"),
        ("TTFT p99 (ms)", "ttft_p99_ms"),
        ("ITL p50 (ms)", "itl_p50_ms"),
        ("ITL p99 (ms)", "itl_p99_ms"),
        ("tokens/s", "tokens_per_s"),
        ("content chunks/request", "chunks_per_request"),
    ]
    header = f"{'':<24}" + "".join(f"{LABELS[n]:>14}" for n in names)
    both = {"meridian", "vllm"} <= set(results)
    print(header + (f"{'meridian/vllm':>15}{'meridian-vllm':>15}" if both else ""))
    for label, attr in rows:
        line = f"{label:<24}" + "".join(f"{getattr(results[n], attr):>14.2f}" for n in names)
        if both:
            m, v = getattr(results["meridian"], attr), getattr(results["vllm"], attr)
            line += f"{m / v:>15.3f}{m - v:>+15.2f}"
        print(line)
    for n in names:
        runs = ", ".join(f"{r:.0f}" for r in results[n].runs_tokens_per_s)
        print(f"{LABELS[n]} tokens/s per run: {runs}")


# -- main --------------------------------------------------------------------------------------


async def interleaved(
    endpoints: dict[str, Endpoint], args: argparse.Namespace
) -> dict[str, list[RunResult]]:
    """``--pairs`` pairs of runs, one system after the other, the order swapped every pair.

    Both systems stay up and the load alternates: one runs while the other idles (an idle
    vLLM engine waits on its queue; the CPU the idle system used during the other's run is
    printed). Short alternating runs put both under the same background load, which on a
    shared host drifts by more than the difference being measured.
    """
    names = list(endpoints)
    for name in names:
        await closed_loop(
            endpoints[name],
            concurrency=args.concurrency,
            requests=args.warmup,
            tokens=args.tokens,
        )
    runs: dict[str, list[RunResult]] = {name: [] for name in names}
    for pair in range(args.pairs):
        order = names if pair % 2 == 0 else names[::-1]
        line = []
        for name in order:
            idle = [n for n in names if n != name]
            idle_before = {n: cpu_seconds(endpoints[n].pids) for n in idle}
            endpoint = endpoints[name]
            own_before = [own_cpu_seconds(pid) for pid in endpoint.pids]
            tree_before = cpu_seconds(endpoint.pids)
            run = await closed_loop(
                endpoint,
                concurrency=args.concurrency,
                requests=args.requests,
                tokens=args.tokens,
            )
            own = [
                own_cpu_seconds(pid) - b for pid, b in zip(endpoint.pids, own_before, strict=True)
            ]
            run.frontend_cpu_s = dict(zip(endpoint.names, own, strict=True))
            run.engine_cpu_s = cpu_seconds(endpoint.pids) - tree_before - sum(own)
            idle_cpu = sum(cpu_seconds(endpoints[n].pids) - idle_before[n] for n in idle)
            runs[name].append(run)
            ttft = percentile([r.ttft_s * 1000 for r in run.records], 50)
            line.append(
                f"{LABELS[name]} {run.tokens_per_s:.0f} tok/s TTFT p50 {ttft:.1f} ms "
                f"frontend {run.frontend_us_per_token():.0f} µs/token "
                f"(idle other: {idle_cpu:.2f} CPU s)"
            )
        print(f"  pair {pair + 1}: " + " | ".join(line), flush=True)
    return runs


def pair_figures(runs: dict[str, list[RunResult]]) -> None:
    """Per pair, each Meridian variant against vllm serve: tokens/s ratio, TTFT p50
    difference and frontend CPU per token ratio; then the goals."""
    if "vllm" not in runs:
        return
    for name in runs:
        parts = {
            proc: statistics.median(
                r.frontend_cpu_s.get(proc, 0.0) / r.tokens * 1e6 for r in runs[name]
            )
            for proc in runs[name][0].frontend_cpu_s
        }
        engine = statistics.median(r.engine_cpu_s / r.tokens * 1e6 for r in runs[name])
        split = ", ".join(f"{proc} {us:.0f}" for proc, us in parts.items())
        print(
            f"{LABELS[name]} frontend CPU µs/token (median run): {sum(parts.values()):.0f} "
            f"({split}); engine core {engine:.0f}"
        )
    for name in [n for n in runs if n != "vllm"]:
        pairs = list(zip(runs[name], runs["vllm"], strict=True))
        ratios = [m.tokens_per_s / v.tokens_per_s for m, v in pairs]
        deltas = [
            percentile([r.ttft_s * 1000 for r in m.records], 50)
            - percentile([r.ttft_s * 1000 for r in v.records], 50)
            for m, v in pairs
        ]
        cpu_ratios = [
            m.frontend_us_per_token() / v.frontend_us_per_token()
            for m, v in pairs
            if v.frontend_us_per_token()
        ]
        label = LABELS[name]
        print(f"\n{label} against vllm serve, per pair:")
        print(
            "  tokens/s ratio: "
            + ", ".join(f"{r:.3f}" for r in ratios)
            + f" (median {statistics.median(ratios):.3f})"
        )
        print(
            "  TTFT p50 difference ms: "
            + ", ".join(f"{d:+.1f}" for d in deltas)
            + f" (median {statistics.median(deltas):+.1f})"
        )
        ratio, delta = statistics.median(ratios), statistics.median(deltas)
        print(f"  goal tokens/s >= 90 % of vllm serve: {ratio:.1%} ({_met(ratio >= 0.9)})")
        print(f"  goal TTFT p50 within 5 ms of vllm serve: {delta:+.1f} ms ({_met(delta <= 5.0)})")
        if cpu_ratios:
            cpu = statistics.median(cpu_ratios)
            print(
                "  frontend CPU per token ratio: "
                + ", ".join(f"{r:.2f}" for r in cpu_ratios)
                + f" (median {cpu:.2f}; does not depend on the core count)"
            )
            print(
                "  goal frontend CPU per token (edge + router + worker) <= vllm serve's: "
                f"{cpu:.2f}x ({_met(cpu <= 1.0)})"
            )


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


async def main(args: argparse.Namespace) -> None:
    model_dir = build_tiny_model(args.model_dir)
    print(
        f"concurrency {args.concurrency}, {args.requests} requests x {args.tokens} tokens per "
        f"run, {args.pairs} pairs of runs, {os.cpu_count()} CPUs, model {model_dir}, "
        f"host load average {os.getloadavg()[0]:.1f}\n",
        flush=True,
    )
    async with contextlib.AsyncExitStack() as stack:
        endpoints = {}
        for name in args.systems:  # started one after the other: a start loads the CPU
            workdir = Path(tempfile.mkdtemp(prefix=f"meridian-bench-{name}-"))
            started = time.perf_counter()
            endpoints[name] = await stack.enter_async_context(
                SYSTEMS[name](model_dir, workdir, stale_after_ms=args.router_stale_after_ms)
            )
            print(f"{LABELS[name]}: up in {time.perf_counter() - started:.1f} s ({workdir})")
        runs = await interleaved(endpoints, args)
    print()
    print_table({name: summarize(r) for name, r in runs.items()})
    pair_figures(runs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.vllm_vs_serve", description=__doc__)
    p.add_argument(
        "--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "meridian-tiny-llama"
    )
    p.add_argument("--concurrency", type=cli.integer(1, 1024), default=8)
    p.add_argument("--requests", type=cli.integer(1, 1_000_000), default=96)
    p.add_argument("--tokens", type=cli.integer(1, 200), default=128)
    p.add_argument("--warmup", type=cli.integer(0, 100_000), default=16)
    p.add_argument(
        "--pairs", type=cli.integer(1, 1000), default=10, help="measured runs of each system"
    )
    p.add_argument(
        "--router-stale-after-ms",
        type=cli.integer(1, 3_600_000),
        default=5000,
        help="the router's --stale-after-ms (its default is 600; see the module docstring)",
    )
    p.add_argument(
        "--systems",
        type=lambda s: [x.strip() for x in s.split(",")],
        default=["meridian", "vllm"],
        help="which to run, in order: meridian, meridian-call (one Generate call per stream "
        "instead of GenerateMux), meridian-engine-metrics (vLLM's own Prometheus metrics "
        "recorded too, as vllm serve does), vllm",
    )
    args = p.parse_args(argv)
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        p.error(f"--systems: unknown {unknown}; expected some of {sorted(SYSTEMS)}")
    if min(args.concurrency, args.requests, args.pairs) < 1 or args.warmup < 0:
        p.error("--concurrency, --requests and --pairs must be >= 1, --warmup >= 0")
    if not 1 <= args.tokens <= 200:
        p.error("--tokens must be 1..200 (the context is 256 tokens)")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
