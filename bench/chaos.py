"""Chaos on the real process stack: do streams survive faults, byte for byte?

    .venv/bin/python -m bench.chaos [--scenario NAME ...] [--streams 16] [--tokens 160]
                                    [--fault-after-s 1.0] [--fault-s 3.0]

Each scenario starts a fresh stack of real processes — Redis, four simulated workers in three
regions (kr ×2, jp, us), the router, the edge (migration on, ``--migration-stall-s 1``) —
with each worker behind a :class:`~services.netem.proxy.DelayProxy` in this process, so link
faults are real TCP behaviour. It then runs ``--streams`` concurrent streams of ``--tokens``
tokens (each its own seed, ``ignore_eos``), injects the fault ``--fault-after-s`` into them,
heals it ``--fault-s`` later where it heals, and checks every stream against the text the
simulator's seed determines (``SimEngine`` text is a function of seed and position):

    failed      streams that did not end with a finish reason and [DONE]
    lost/dup    tokens missing from / repeated in the client's text (a diff of token pieces)
    usage       streams whose usage differs from an uninterrupted run's
    gap         the longest time any client waited between two tokens
    out         how long until the router's view had the faulted worker out of rotation
                (unhealthy or draining); "-" where the fault takes no worker out
    migrated    streams that moved to another worker (the edge's counter)

Scenarios: worker-kill9, worker-sigstop, worker-drain, link-cut (region kr), link-degraded
(kr: +300 ms one way, 5 % loss), router-restart, redis-restart, edge-drain. The tests in
tests/e2e/test_chaos.py run the same scenarios, smaller, and assert 0 / 0 / 0.
Figures from this machine are in bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis

from bench._edge import ONE_CLIENT_EDGE_ARGS
from services.common import cli
from services.common.clock import SYSTEM_CLOCK
from services.common.net import free_port
from services.edge.tenancy.apikeys import KeyHasher, load_pepper, new_pepper
from services.edge.tenancy.directory import Directory
from services.edge.tenancy.tenants import Tenant
from services.localstack.procs import ManagedProcess
from services.localstack.redis_server import RedisServer
from services.netem.config import LinkProfile, Route
from services.netem.proxy import CutMode, DelayProxy
from services.worker.engine import ChatTurn
from services.worker.sim.text import TextGenerator, render_chat, seed_for, split_pieces, tokenize
from tests.support.sse import StreamResult, chat_stream

MODEL = "meridian-sim"
PROMPT = "Tell me a long story about the regions of the world."
#: (region, workers, one-way delay ms)
REGIONS: tuple[tuple[str, int, float], ...] = (("kr", 2, 2.0), ("jp", 1, 18.0), ("us", 1, 70.0))
#: Modelled time runs 4x slower than a fast GPU: ~25 ms per token, so a fault lands mid-stream.
SIM_CONFIG = {"time_scale": 4.0}
EDGE_ARGS = (
    *ONE_CLIENT_EDGE_ARGS,
    "--migration-stall-s",
    "1.0",
    "--migration-max-gap-s",
    "10",
    "--drain-grace-s",
    "30",
    "--first-token-timeout-s",
    "10",
)
FAULTED = "kr-1"


@dataclass
class ChaosStack:
    """Real processes; the delay proxies live in this process so faults can be injected."""

    run_dir: Path
    redis: RedisServer
    workers: dict[str, ManagedProcess] = field(default_factory=dict)
    proxies: dict[str, DelayProxy] = field(default_factory=dict)
    links: dict[str, LinkProfile] = field(default_factory=dict)
    router: ManagedProcess | None = None
    router_port: int = 0
    debug_url: str = ""
    edge: ManagedProcess | None = None
    edge_url: str = ""
    admin_url: str = ""
    key: str = ""

    @property
    def base_url(self) -> str:
        return f"{self.edge_url}/v1"

    def _proc(self, name: str, module: str, *args: str) -> ManagedProcess:
        ready = self.run_dir / f"{name}.ready"
        return ManagedProcess(
            name=name,
            argv=[sys.executable, "-m", module, "--ready-file", str(ready), *args],
            log_path=self.run_dir / "logs" / f"{name}.log",
            ready_file=ready,
        )

    @classmethod
    async def start(cls, run_dir: Path, *, worker_drain_grace_s: float = 1.0) -> ChaosStack:
        await asyncio.to_thread(run_dir.mkdir, parents=True, exist_ok=True)
        stack = cls(run_dir=run_dir, redis=RedisServer(run_dir=run_dir / "redis"))
        try:
            await stack._start(worker_drain_grace_s)
        except BaseException:
            await stack.stop()
            raise
        return stack

    async def _start(self, worker_drain_grace_s: float) -> None:
        await self.redis.start()
        sim_file = self.run_dir / "sim.json"
        sim_file.write_text(json.dumps(SIM_CONFIG))
        for region, count, _ in REGIONS:
            for i in range(1, count + 1):
                name = f"{region}-{i}"
                self.workers[name] = self._proc(
                    name,
                    "services.worker",
                    *("--engine", "sim", "--model", MODEL, "--sim-config", str(sim_file)),
                    *("--worker-id", name, "--region", region, "--log-level", "warning"),
                    *("--drain-grace-s", str(worker_drain_grace_s)),
                )
        for proc in self.workers.values():
            await proc.start()
        delays = {region: delay for region, _, delay in REGIONS}
        for name, proc in self.workers.items():
            info = await proc.wait_ready(60.0)
            link = LinkProfile(delay_ms=delays[name.split("-")[0]])
            proxy = DelayProxy(
                Route(name=name, upstream_host="127.0.0.1", upstream_port=info["port"], link=link)
            )
            await proxy.start()
            self.proxies[name] = proxy
            self.links[name] = link
        self.router_port = free_port()
        await self.start_router()
        pepper_file = self.run_dir / "pepper"
        pepper_file.write_text(new_pepper() + "\n")
        pepper_file.chmod(0o600)
        token_file = self.run_dir / "admin-token"
        token_file.write_text(new_pepper() + "\n")
        token_file.chmod(0o600)
        client = aioredis.Redis.from_url(self.redis.url)
        try:
            hasher = KeyHasher(load_pepper(file=pepper_file))
            directory = Directory(redis=client, hasher=hasher, clock=SYSTEM_CLOCK)
            await directory.ensure_tenant(Tenant(tenant_id="chaos"))
            self.key, _ = await directory.create_key("chaos", name="chaos")
        finally:
            await client.aclose()
        self.edge = self._proc(
            "edge",
            "services.edge",
            *("--port", "0", "--plain-http", "--redis-url", self.redis.url),
            *("--router", f"127.0.0.1:{self.router_port}", "--site", "seoul"),
            *("--key-pepper-file", str(pepper_file), "--admin-port", "0"),
            *("--admin-token-file", str(token_file), "--log-level", "warning"),
            *EDGE_ARGS,
        )
        await self.edge.start()
        info = await self.edge.wait_ready(30.0)
        self.edge_url = f"http://127.0.0.1:{info['port']}"
        self.admin_url = f"http://127.0.0.1:{info['admin_port']}"
        self._admin_token = token_file.read_text().strip()
        await self.wait_ready()

    async def start_router(self) -> None:
        args = ["--site", "seoul", "--port", str(self.router_port), "--debug-port", "0"]
        for p in self.proxies.values():
            args += ["--worker", f"{p.host}:{p.port}"]
        self.router = self._proc("router", "services.router", *args, "--log-level", "warning")
        await self.router.start()
        info = await self.router.wait_ready(30.0)
        self.debug_url = f"http://127.0.0.1:{info['debug_port']}"

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the router sees every worker healthy and the edge is ready."""
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.get(f"{self.debug_url}/debug/view") as r:
                        view = await r.json()
                    healthy = sum(1 for w in view["workers"] if w["healthy"])
                    async with s.get(f"{self.edge_url}/readyz") as r:
                        if r.status == 200 and healthy == len(self.workers):
                            return
                await asyncio.sleep(0.1)
        raise RuntimeError("the chaos stack did not become ready")

    async def edge_counters(self) -> dict[str, int]:
        async with (
            aiohttp.ClientSession() as s,
            s.get(
                f"{self.admin_url}/admin/stats",
                headers={"Authorization": f"Bearer {self._admin_token}"},
            ) as r,
        ):
            body = await r.json()
        counters: dict[str, int] = body.get("counters", body)
        return counters

    async def stop(self) -> None:
        for proc in (self.edge, self.router):
            if proc is not None:
                await proc.stop(grace_s=10.0)
        for proxy in self.proxies.values():
            await proxy.close()
        for proc in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                if proc.pid is not None:
                    os.kill(proc.pid, signal.SIGCONT)  # a frozen worker cannot drain
        await asyncio.gather(*(p.stop(grace_s=5.0) for p in self.workers.values()))
        await self.redis.stop()


# --- the faults --------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    apply: Callable[[ChaosStack], Awaitable[None]]
    heal: Callable[[ChaosStack], Awaitable[None]] | None = None
    takes_out: str | None = FAULTED  # the worker expected to leave rotation


def _signal_worker(sig: signal.Signals) -> Callable[[ChaosStack], Awaitable[None]]:
    async def send(stack: ChaosStack) -> None:
        pid = stack.workers[FAULTED].pid
        assert pid is not None
        os.kill(pid, sig)

    return send


async def _cut_kr(stack: ChaosStack) -> None:
    for name, proxy in stack.proxies.items():
        if name.startswith("kr-"):
            proxy.cut(CutMode.REFUSE, reset_existing=True)


async def _restore_links(stack: ChaosStack) -> None:
    for name, proxy in stack.proxies.items():
        proxy.restore()
        proxy.set_link(stack.links[name])


async def _degrade_kr(stack: ChaosStack) -> None:
    for name, proxy in stack.proxies.items():
        if name.startswith("kr-"):
            proxy.set_link(LinkProfile(delay_ms=stack.links[name].delay_ms + 300.0, loss=0.05))


async def _kill_router(stack: ChaosStack) -> None:
    assert stack.router is not None
    stack.router.kill()


async def _restart_router(stack: ChaosStack) -> None:
    assert stack.router is not None
    await stack.router.stop(grace_s=1.0)
    await stack.start_router()


async def _kill_redis(stack: ChaosStack) -> None:
    stack.redis.process.kill()


async def _restart_redis(stack: ChaosStack) -> None:
    await stack.redis.process.stop(grace_s=1.0)
    await stack.redis.start()


async def _drain_edge(stack: ChaosStack) -> None:
    assert stack.edge is not None
    assert stack.edge.pid is not None
    os.kill(stack.edge.pid, signal.SIGTERM)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("worker-kill9", _signal_worker(signal.SIGKILL)),
        Scenario("worker-sigstop", _signal_worker(signal.SIGSTOP), _signal_worker(signal.SIGCONT)),
        Scenario("worker-drain", _signal_worker(signal.SIGTERM)),
        Scenario("link-cut", _cut_kr, _restore_links),
        Scenario("link-degraded", _degrade_kr, _restore_links, takes_out=None),
        Scenario("router-restart", _kill_router, _restart_router, takes_out=None),
        Scenario("redis-restart", _kill_redis, _restart_redis, takes_out=None),
        Scenario("edge-drain", _drain_edge, takes_out=None),
    )
}


# --- the load and its checks ----------------------------------------------------------------


def expected_pieces(seed: int, tokens: int) -> list[str]:
    """The tokens an uninterrupted ``SimEngine`` stream with this seed produces."""
    prompt = render_chat([ChatTurn(role="user", content=PROMPT)])
    gen = TextGenerator(seed_for("seed", seed, prompt))
    return [gen.next_piece() for _ in range(tokens)]


def prompt_tokens() -> int:
    return len(tokenize(render_chat([ChatTurn(role="user", content=PROMPT)])))


def lost_and_duplicated(expected: list[str], got_text: str) -> tuple[int, int]:
    if "".join(expected) == got_text:
        return 0, 0
    got = split_pieces(got_text)
    lost = dup = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(
        a=expected, b=got, autojunk=False
    ).get_opcodes():
        if op in ("delete", "replace"):
            lost += i2 - i1
        if op in ("insert", "replace"):
            dup += j2 - j1
    return lost, dup


@dataclass
class Row:
    scenario: str
    streams: int
    failed: int = 0
    lost: int = 0
    duplicated: int = 0
    usage_wrong: int = 0
    longest_gap_s: float = 0.0
    out_of_rotation_s: float | None = None
    migrated: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.failed or self.lost or self.duplicated or self.usage_wrong)


async def _watch_rotation(stack: ChaosStack, worker: str, since: float, out: list[float]) -> None:
    """Poll the router's view until ``worker`` is unhealthy or draining (or gone)."""
    async with aiohttp.ClientSession() as s:
        while True:
            with contextlib.suppress(aiohttp.ClientError, json.JSONDecodeError):
                async with s.get(f"{stack.debug_url}/debug/view") as r:
                    view = await r.json()
                entry = next((w for w in view["workers"] if w["worker_id"] == worker), None)
                if entry is None or not entry["healthy"] or entry["draining"]:
                    out.append(time.monotonic() - since)
                    return
            await asyncio.sleep(0.05)


async def run_scenario(
    scenario: Scenario,
    *,
    streams: int,
    tokens: int,
    fault_after_s: float,
    fault_s: float,
    run_dir: Path,
) -> Row:
    stack = await ChaosStack.start(run_dir / scenario.name)
    row = Row(scenario=scenario.name, streams=streams)
    try:
        before = (await stack.edge_counters()).get("migrations", 0)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
        ) as session:
            bodies = [
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": PROMPT}],
                    "max_tokens": tokens,
                    "seed": 1000 + i,
                    "ignore_eos": True,
                }
                for i in range(streams)
            ]
            load = [
                asyncio.ensure_future(chat_stream(session, stack.base_url, stack.key, b))
                for b in bodies
            ]
            await asyncio.sleep(fault_after_s)
            faulted_at = time.monotonic()
            await scenario.apply(stack)
            rotation: list[float] = []
            watcher = (
                asyncio.ensure_future(
                    _watch_rotation(stack, scenario.takes_out, faulted_at, rotation)
                )
                if scenario.takes_out
                else None
            )
            if scenario.heal is not None:
                await asyncio.sleep(fault_s)
                await scenario.heal(stack)
            results: list[StreamResult | BaseException] = await asyncio.gather(
                *load, return_exceptions=True
            )
            if watcher is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(watcher), 2.0)
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            row.out_of_rotation_s = rotation[0] if rotation else None
        if scenario.name != "edge-drain":
            row.migrated = (await stack.edge_counters()).get("migrations", 0) - before
        for i, res in enumerate(results):
            if isinstance(res, BaseException):
                row.failed += 1
                row.errors.append(f"stream {i}: {type(res).__name__}: {res}")
                continue
            if not res.ok:
                row.failed += 1
                row.errors.append(f"stream {i}: {res.error or res.body or 'no finish'}")
            lost, dup = lost_and_duplicated(expected_pieces(1000 + i, tokens), res.text)
            row.lost += lost
            row.duplicated += dup
            want = {"prompt_tokens": prompt_tokens(), "completion_tokens": tokens}
            if res.usage is None or any(res.usage.get(k) != v for k, v in want.items()):
                row.usage_wrong += 1
            row.longest_gap_s = max(row.longest_gap_s, res.max_gap_s)
            if res.meridian and scenario.name == "edge-drain":
                row.migrated += res.meridian.get("migrations", 0)
    finally:
        await stack.stop()
    return row


def render(rows: list[Row], streams: int, tokens: int) -> str:
    head = (
        f"chaos: {streams} concurrent streams x {tokens} tokens per scenario "
        "(fresh stack each; every stream checked against its seed's text)\n"
    )
    cols = f"{'scenario':<16}{'failed':>7}{'lost':>6}{'dup':>5}{'usage':>7}{'gap s':>8}"
    cols += f"{'out s':>8}{'migrated':>10}"
    lines = [head, cols]
    for r in rows:
        out = "-" if r.out_of_rotation_s is None else f"{r.out_of_rotation_s:.2f}"
        lines.append(
            f"{r.scenario:<16}{r.failed:>7}{r.lost:>6}{r.duplicated:>5}{r.usage_wrong:>7}"
            f"{r.longest_gap_s:>8.2f}{out:>8}{r.migrated:>10}"
        )
        lines += [f"    {e}" for e in r.errors[:3]]
    return "\n".join(lines)


async def amain(args: argparse.Namespace) -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="meridian-chaos-") as tmp:
        for name in args.scenario or list(SCENARIOS):
            row = await run_scenario(
                SCENARIOS[name],
                streams=args.streams,
                tokens=args.tokens,
                fault_after_s=args.fault_after_s,
                fault_s=args.fault_s,
                run_dir=Path(tmp),
            )
            rows.append(row)
            print(
                render([row], args.streams, args.tokens).splitlines()[-1 - min(3, len(row.errors))],
                flush=True,
            )
    print()
    print(render(rows, args.streams, args.tokens))
    return 0 if all(r.clean for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    p.add_argument(
        "--streams", type=cli.positive_int, default=16, help="concurrent streams (64 on a big host)"
    )
    p.add_argument(
        "--tokens", type=cli.positive_int, default=160, help="tokens per stream (256 on a big host)"
    )
    p.add_argument("--fault-after-s", type=cli.non_negative_float, default=1.0)
    p.add_argument(
        "--fault-s", type=cli.positive_float, default=3.0, help="how long a healing fault lasts"
    )
    args = p.parse_args(argv)
    logging.getLogger("services.netem").setLevel(logging.ERROR)  # faults are the point here
    if args.streams < 1 or args.tokens < 2:
        p.error("--streams must be >= 1 and --tokens >= 2")
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
