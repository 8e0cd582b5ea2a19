"""Meridian beside other proxies, in one invocation and paired: direct vs Meridian (edge → router
→ worker with ``--engine openai``) vs vllm-router vs LiteLLM, all in front of the same fake
OpenAI backend (bench/fake_openai.py: first token after 20 ms, then one every 10 ms, 64
tokens, streaming).

    .venv/bin/python -m bench.peers [--concurrency 1 8 32 128] [--with-256] [--requests 128]
        [--systems meridian,vllm-router,litellm] [--edge-workers 1 [2]] [--out DIR]

For each concurrency level and each proxy (their order rotated per level) a direct run against
the backend comes right before the proxy's run, so each proxy is judged against the machine
as it was a moment earlier. Each run is a closed loop: ``concurrency`` streams kept busy until
``max(--requests, 2 × concurrency)`` chat completions are done, by one aiohttp SSE client on
uvloop (the same for every system). Printed per run: TTFT p50/p99 and what the proxy added to
them against its direct run, ITL p99 (direct's beside it), tokens/s as a share of direct's,
errors, and the CPU each proxy process (with its children) burned per token delivered, read
from ``/proc/<pid>/stat`` (utime + stime) before and after the run. Writes ``peers.json`` and
``peers.png`` (matplotlib) to ``--out``.

vllm-router (``vllm-router==0.1.17``) and LiteLLM (``litellm[proxy]==1.108.0``) are installed
on first use into their own environment, ``.bench-peers/venv`` (``--peers-env``), never into
Meridian's; a peer that cannot be installed or started is reported and skipped.
``--edge-workers 1 2`` also runs Meridian with two edge processes (``--workers 2``);
``--worker-transports call mux`` also runs it with one Generate call per stream
(``meridian-call``; the default is the edge's, GenerateMux).

The machine is shared and has 2 cores: the backend, the proxy and the client share them, so
absolute figures move with the load average (printed); compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis

from bench._cpu import cpu_seconds
from bench._edge import ONE_CLIENT_EDGE_ARGS
from services.common import cli
from services.common.clock import SYSTEM_CLOCK
from services.common.net import free_port
from services.edge.tenancy.apikeys import KeyHasher, load_pepper, new_pepper
from services.edge.tenancy.directory import Directory
from services.edge.tenancy.tenants import Tenant
from services.localstack.procs import ManagedProcess, ProcessFailed
from services.localstack.redis_server import RedisServer

REPO = Path(__file__).resolve().parents[1]
MODEL = "fake-model"
PROMPT = [{"role": "user", "content": "Tell me about the edge of the network."}]
PEER_PINS = {"vllm-router": "vllm-router==0.1.17", "litellm": "litellm[proxy]==1.108.0"}


# -- the client --------------------------------------------------------------------------------


@dataclass(slots=True)
class Sample:
    ttft_s: float
    gaps_s: list[float]
    tokens: int


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0
    first_error: str = ""

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.samples)

    def figures(self) -> dict[str, float]:
        ttft = [s.ttft_s * 1000 for s in self.samples]
        gaps = [g * 1000 for s in self.samples for g in s.gaps_s]
        return {
            "ttft_p50_ms": pct(ttft, 50),
            "ttft_p99_ms": pct(ttft, 99),
            "itl_p50_ms": pct(gaps, 50),
            "itl_p99_ms": pct(gaps, 99),
            "tokens_per_s": self.tokens / self.wall_s if self.wall_s else 0.0,
            "tokens": float(self.tokens),
            "requests": float(len(self.samples)),
            "errors": float(self.errors),
        }


def pct(values: list[float], p: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


@dataclass(frozen=True)
class Target:
    base_url: str  # ".../v1"
    api_key: str
    #: label → root pid of each proxy process whose CPU is measured (children included)
    processes: dict[str, int]


async def one_request(session: aiohttp.ClientSession, target: Target, tokens: int) -> Sample:
    body = {
        "model": MODEL,
        "messages": PROMPT,
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = last = 0.0
    gaps: list[float] = []
    counted = usage = 0
    async with session.post(
        f"{target.base_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {target.api_key}"},
    ) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            if b'"content":"' in line and b'"content":""' not in line:
                now = time.perf_counter()
                if not first:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
                counted += 1
            if b'"completion_tokens"' in line:
                data = json.loads(line[6:])
                if data.get("usage"):
                    usage = int(data["usage"]["completion_tokens"])
    if not first:
        raise RuntimeError("no content in the stream")
    return Sample(first - start, gaps, usage or counted)


async def closed_loop(
    session: aiohttp.ClientSession, target: Target, concurrency: int, requests: int, tokens: int
) -> Run:
    run = Run()
    todo = iter(range(requests))

    async def lane() -> None:
        for _ in todo:
            try:
                run.samples.append(await one_request(session, target, tokens))
            except (aiohttp.ClientError, RuntimeError, TimeoutError) as err:
                run.errors += 1
                run.first_error = run.first_error or f"{type(err).__name__}: {err}"[:300]

    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    run.wall_s = time.perf_counter() - start
    return run


# -- processes ---------------------------------------------------------------------------------


def _proc(
    workdir: Path,
    name: str,
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    ready: bool = False,
) -> ManagedProcess:
    return ManagedProcess(
        name=name,
        argv=list(argv),
        log_path=workdir / f"{name}.log",
        ready_file=workdir / f"{name}.ready" if ready else None,
        env=env,
    )


async def wait_http(url: str, proc: ManagedProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            if not proc.alive():
                raise ProcessFailed(f"{proc.name} exited:\n{proc.log_tail()}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() > deadline:
                raise ProcessFailed(f"{url} not ready after {timeout_s:.0f}s:\n{proc.log_tail()}")
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def fake_backend(workdir: Path, args: argparse.Namespace) -> AsyncIterator[Target]:
    p = _proc(
        workdir,
        "fake-backend",
        [
            sys.executable,
            "-m",
            "bench.fake_openai",
            "--ready-file",
            str(workdir / "fake-backend.ready"),
            "--tokens",
            str(args.tokens),
            "--ttft-ms",
            str(args.ttft_ms),
            "--itl-ms",
            str(args.itl_ms),
            "--model",
            MODEL,
        ],
        ready=True,
    )
    await p.start()
    try:
        info = await p.wait_ready(20)
        assert p.pid is not None
        yield Target(f"http://127.0.0.1:{info['port']}/v1", "none", {"backend": p.pid})
    finally:
        await p.stop(grace_s=5)


@contextlib.asynccontextmanager
async def meridian(
    workdir: Path, backend: Target, edge_workers: int, transport: str = "mux"
) -> AsyncIterator[Target]:
    """Redis, one worker with ``--engine openai`` in front of the backend, the router, the
    edge (``--workers edge_workers``, ``--worker-transport transport``); a tenant without
    limits and a key for it."""
    workdir = workdir / f"meridian-{edge_workers}-{transport}"
    python = sys.executable
    redis = RedisServer(run_dir=workdir / "redis")
    procs: list[ManagedProcess] = []

    def service(name: str, module: str, *flags: str) -> ManagedProcess:
        p = _proc(
            workdir,
            name,
            [
                python,
                "-m",
                module,
                "--ready-file",
                str(workdir / f"{name}.ready"),
                "--log-level",
                "warning",
                *flags,
            ],
            ready=True,
        )
        procs.append(p)
        return p

    try:
        await redis.start()
        worker = service(
            "worker",
            "services.worker",
            "--engine",
            "openai",
            "--upstream-url",
            backend.base_url,
            "--upstream-metrics",
            "off",
            "--max-num-seqs",
            "4096",
            "--worker-id",
            "bench-1",
            "--region",
            "local",
        )
        await worker.start()
        w = await worker.wait_ready(60)
        router = service(
            "router",
            "services.router",
            "--worker",
            f"127.0.0.1:{w['port']}",
            "--stale-after-ms",
            "5000",
        )
        await router.start()
        r = await router.wait_ready(30)
        pepper = workdir / "key-pepper"
        pepper.write_text(new_pepper() + "\n")
        pepper.chmod(0o600)
        edge = service(
            "edge",
            "services.edge",
            "--port",
            str(free_port()),
            "--plain-http",
            "--redis-url",
            redis.url,
            "--router",
            f"127.0.0.1:{r['port']}",
            "--key-pepper-file",
            str(pepper),
            "--workers",
            str(edge_workers),
            "--worker-transport",
            transport,
            *ONE_CLIENT_EDGE_ARGS,
        )
        await edge.start()
        e = await edge.wait_ready(60)
        client = aioredis.Redis.from_url(redis.url)
        try:
            directory = Directory(
                redis=client, hasher=KeyHasher(load_pepper(file=pepper)), clock=SYSTEM_CLOCK
            )
            await directory.ensure_tenant(Tenant(tenant_id="bench"))
            key, _ = await directory.create_key("bench", name="peers")
        finally:
            await client.aclose()
        base = f"http://127.0.0.1:{e['port']}"
        await wait_http(f"{base}/readyz", edge, 60)
        pids = {p.name: p.pid for p in procs if p.pid is not None}
        yield Target(f"{base}/v1", key, pids)
    finally:
        for p in reversed(procs):
            await p.stop(grace_s=10)
        await redis.stop()


def ensure_peer(env_dir: Path, peer: str, *, install: bool) -> Path | None:
    """The bench environment's bin/ with ``peer`` installed (pinned), or None (said why)."""
    python = env_dir / "bin" / "python"
    stamp = env_dir / f".installed-{peer}"
    pin = PEER_PINS[peer]
    if stamp.exists() and stamp.read_text().strip() == pin:
        return env_dir / "bin"
    if not install:
        print(f"  {peer}: not installed in {env_dir} and --no-install given; skipped")
        return None
    if not python.exists():
        print(f"  creating the bench environment {env_dir} ...", flush=True)
        made = subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=False)
        if made.returncode != 0:
            print(f"  {peer}: could not create {env_dir}; skipped")
            return None
    print(f"  installing {pin} into {env_dir} ...", flush=True)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", pin],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        print(f"  {peer}: pip install {pin} failed; skipped:\n    " + "\n    ".join(tail))
        return None
    stamp.write_text(pin + "\n")
    return env_dir / "bin"


@contextlib.asynccontextmanager
async def vllm_router(workdir: Path, backend: Target, bindir: Path) -> AsyncIterator[Target]:
    port = free_port()
    origin = backend.base_url.removesuffix("/v1")
    p = _proc(
        workdir,
        "vllm-router",
        [
            str(bindir / "vllm-router"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            origin,
            "--policy",
            "round_robin",
            "--max-concurrent-requests",
            "4096",
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warning",
            "--log-dir",
            str(workdir / "vllm-router-logs"),
        ],
    )
    await p.start()
    try:
        await wait_http(f"http://127.0.0.1:{port}/health", p, 60)
        assert p.pid is not None
        yield Target(f"http://127.0.0.1:{port}/v1", "none", {"vllm-router": p.pid})
    finally:
        await p.stop(grace_s=10)


@contextlib.asynccontextmanager
async def litellm(workdir: Path, backend: Target, bindir: Path) -> AsyncIterator[Target]:
    port = free_port()
    master_key = "sk-bench-" + os.urandom(16).hex()  # LiteLLM refuses to start without one
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {backend.base_url}\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "  telemetry: false\n"
    )
    env = {
        "LITELLM_LOG": "ERROR",
        "LITELLM_MASTER_KEY": master_key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    p = _proc(
        workdir,
        "litellm",
        [
            str(bindir / "litellm"),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        env=env,
    )
    await p.start()
    try:
        await wait_http(f"http://127.0.0.1:{port}/health/liveliness", p, 180)
        assert p.pid is not None
        yield Target(f"http://127.0.0.1:{port}/v1", master_key, {"litellm": p.pid})
    finally:
        await p.stop(grace_s=10)


# -- the comparison ----------------------------------------------------------------------------


@dataclass
class Row:
    concurrency: int
    system: str
    direct: dict[str, float]
    proxy: dict[str, float]
    cpu_us_per_token: dict[str, float]
    backend_cpu_us_per_token: float
    first_error: str = ""

    def added(self, key: str) -> float:
        return self.proxy[key] - self.direct[key]


async def measured(
    session: aiohttp.ClientSession, target: Target, c: int, n: int, tokens: int
) -> tuple[Run, dict[str, float]]:
    before = {label: cpu_seconds([pid]) for label, pid in target.processes.items()}
    run = await closed_loop(session, target, c, n, tokens)
    used = {label: cpu_seconds([pid]) - before[label] for label, pid in target.processes.items()}
    return run, used


def per_token(used: dict[str, float], tokens: int) -> dict[str, float]:
    return {k: (v / tokens * 1e6 if tokens else float("nan")) for k, v in used.items()}


def print_row(row: Row) -> None:
    d, p = row.direct, row.proxy
    cpu = ", ".join(f"{k} {v:,.0f}" for k, v in row.cpu_us_per_token.items())
    share = p["tokens_per_s"] / d["tokens_per_s"] * 100 if d["tokens_per_s"] else float("nan")
    print(
        f"{row.concurrency:>4} {row.system:<12} "
        f"{p['ttft_p50_ms']:>7.1f} ({row.added('ttft_p50_ms'):>+7.1f}) "
        f"{p['ttft_p99_ms']:>7.1f} ({row.added('ttft_p99_ms'):>+7.1f}) "
        f"{p['itl_p99_ms']:>6.1f} ({d['itl_p99_ms']:>5.1f}) "
        f"{share:>5.1f}% {int(p['errors']):>4}  {cpu}  "
        f"[backend {row.backend_cpu_us_per_token:.0f}]",
        flush=True,
    )
    if row.first_error:
        print(f"       first error: {row.first_error}")


SystemFactory = Callable[[], contextlib.AbstractAsyncContextManager[Target]]


async def compare(args: argparse.Namespace) -> list[Row]:
    workdir = Path(tempfile.mkdtemp(prefix="meridian-peers-"))
    rows: list[Row] = []
    async with contextlib.AsyncExitStack() as stack:
        backend = await stack.enter_async_context(fake_backend(workdir, args))
        systems: dict[str, Target] = {}
        wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
        for name in wanted:
            try:
                if name == "meridian":
                    for transport in args.worker_transports:
                        for n in args.edge_workers:
                            label = "meridian" if n == 1 else f"meridian-{n}e"
                            label += "" if transport == "mux" else f"-{transport}"
                            print(f"starting {label} ...", flush=True)
                            systems[label] = await stack.enter_async_context(
                                meridian(workdir, backend, n, transport)
                            )
                elif name in PEER_PINS:
                    bindir = ensure_peer(args.peers_env, name, install=not args.no_install)
                    if bindir is None:
                        continue
                    print(f"starting {name} ...", flush=True)
                    factory = vllm_router if name == "vllm-router" else litellm
                    systems[name] = await stack.enter_async_context(
                        factory(workdir, backend, bindir)
                    )
            except (ProcessFailed, OSError) as err:
                print(f"  {name}: could not start; skipped:\n    {str(err)[-800:]}")
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            for target in (backend, *systems.values()):
                await closed_loop(session, target, 4, 16, args.tokens)  # warm connections
            print(
                f"\n{'conc':>4} {'system':<12} {'TTFT p50 (added)':>17} {'p99 (added)':>17} "
                f"{'ITL p99 (direct)':>14} {'tok/s':>6} {'err':>4}  CPU µs/token per process"
            )
            names = list(systems)
            for level, c in enumerate(args.concurrency):
                n = max(args.requests, 2 * c)
                order = names[level % len(names) :] + names[: level % len(names)] if names else []
                for name in order:
                    direct, direct_cpu = await measured(session, backend, c, n, args.tokens)
                    await asyncio.sleep(args.pause_s)
                    target = systems[name]
                    proxied_processes = {**target.processes, **backend.processes}
                    run, used = await measured(
                        session,
                        Target(target.base_url, target.api_key, proxied_processes),
                        c,
                        n,
                        args.tokens,
                    )
                    await asyncio.sleep(args.pause_s)
                    used.pop("backend")  # the same backend's cost is printed from direct
                    row = Row(
                        concurrency=c,
                        system=name,
                        direct=direct.figures(),
                        proxy=run.figures(),
                        cpu_us_per_token=per_token(used, run.tokens),
                        backend_cpu_us_per_token=per_token(
                            {"b": direct_cpu["backend"]}, direct.tokens
                        )["b"],
                        first_error=run.first_error or direct.first_error,
                    )
                    rows.append(row)
                    print_row(row)
    return rows


def plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = sorted({r.system for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for name in systems:
        mine = sorted((r for r in rows if r.system == name), key=lambda r: r.concurrency)
        xs = [r.concurrency for r in mine]
        axes[0].plot(xs, [max(r.added("ttft_p50_ms"), 0.01) for r in mine], "o-", label=name)
        axes[1].plot(
            xs,
            [r.proxy["tokens_per_s"] / r.direct["tokens_per_s"] * 100 for r in mine],
            "o-",
            label=name,
        )
        axes[2].plot(xs, [sum(r.cpu_us_per_token.values()) for r in mine], "o-", label=name)
    axes[0].set(
        xscale="log",
        yscale="log",
        xlabel="concurrency",
        ylabel="ms",
        title="added TTFT p50 vs direct",
    )
    axes[1].set(xscale="log", xlabel="concurrency", ylabel="% of direct", title="tokens/s")
    axes[2].set(
        xscale="log",
        yscale="log",
        xlabel="concurrency",
        ylabel="µs per token",
        title="proxy CPU per token (all its processes)",
    )
    levels = sorted({r.concurrency for r in rows})
    for ax in axes:
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--concurrency", type=cli.positive_int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--with-256", action="store_true", help="add concurrency 256")
    p.add_argument(
        "--requests", type=cli.positive_int, default=128, help="per run (at least 2 × concurrency)"
    )
    p.add_argument("--tokens", type=cli.integer(2), default=64)
    p.add_argument("--ttft-ms", type=cli.non_negative_float, default=20.0)
    p.add_argument("--itl-ms", type=cli.non_negative_float, default=10.0)
    p.add_argument("--systems", default="meridian,vllm-router,litellm")
    p.add_argument(
        "--edge-workers",
        type=cli.positive_int,
        nargs="+",
        default=[1],
        help="Meridian edge processes; '1 2' runs both",
    )
    p.add_argument(
        "--worker-transports",
        nargs="+",
        choices=("call", "mux"),
        default=["mux"],
        help="Meridian's edge-to-worker transport (--worker-transport, default mux); "
        "'call mux' runs both",
    )
    p.add_argument("--peers-env", type=Path, default=REPO / ".bench-peers" / "venv")
    p.add_argument("--no-install", action="store_true")
    p.add_argument("--pause-s", type=cli.non_negative_float, default=0.5)
    p.add_argument("--out", type=cli.output_dir, default=REPO / "bench" / "results" / "tmp")
    args = p.parse_args(argv)
    if args.with_256 and 256 not in args.concurrency:
        args.concurrency.append(256)
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in wanted if s != "meridian" and s not in PEER_PINS]
    if unknown or not wanted:
        p.error(
            f"--systems: unknown {unknown or [args.systems]}; "
            f"expected some of {['meridian', *sorted(PEER_PINS)]}, comma-separated"
        )
    return args


async def main(args: argparse.Namespace) -> None:
    load = os.getloadavg()
    title = (
        f"bench.peers: {args.tokens} tokens, TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms; "
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at start"
    )
    print(title, flush=True)
    rows = await compare(args)
    end_load = os.getloadavg()
    print(f"load average at end: {end_load[0]:.1f}/{end_load[1]:.1f}/{end_load[2]:.1f}")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "command": " ".join(["python -m bench.peers", *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "load_average_start": load,
        "load_average_end": end_load,
        "pins": PEER_PINS,
        "rows": [asdict(r) for r in rows],
    }
    (args.out / "peers.json").write_text(json.dumps(result, indent=1))
    if rows:
        end = f", {end_load[0]:.1f}/{end_load[1]:.1f}/{end_load[2]:.1f} at end"
        plot(rows, args.out / "peers.png", title + end)
    print(f"wrote {args.out / 'peers.json'} and {args.out / 'peers.png'}")


def _run(coro: Awaitable[None]) -> None:
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:  # pragma: no cover
        asyncio.run(coro)  # type: ignore[arg-type]


if __name__ == "__main__":
    _run(main(parse_args()))
