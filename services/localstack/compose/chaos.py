"""Faults on the compose stack through the docker SDK, under load, with the figures an
operator rehearsing a regional outage wants (the process stack's chaos suite reports the
same ones):

=====================  ===============================================================
scenario               fault (and how it is healed)
=====================  ===============================================================
worker-killed          SIGKILL to ``worker-kr-1`` (started again)
region-paused          every container of region ``kr`` frozen (cgroup freezer; unpaused)
region-disconnected    ``worker-jp-1`` cut off the compose network (connected again)
redis-restarted        ``redis`` restarted (keys survive: append-only file)
=====================  ===============================================================

Figures: requests sent / failed (a status other than 200 or a broken stream), the longest
gap a streaming client saw between two chunks, the time until the fault was out of the
router's rotation (every faulted worker ``healthy: false`` in ``/debug/view``), and the time
until it was back after healing. Load: ``clients`` concurrent streaming chat requests, each
``max_tokens`` long, from the host to the edge's published port (127.0.0.1 only).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import docker.errors

from services.localstack.compose.stack import ComposeStack

MODEL = "meridian-sim"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    #: Worker ids the router must take out of rotation (empty: not a worker fault).
    targets: tuple[str, ...]
    inject: Callable[[ComposeStack], None]
    heal: Callable[[ComposeStack], None]


def _kill(stack: ComposeStack) -> None:
    stack.container("worker-kr-1").kill()


def _restart_worker(stack: ComposeStack) -> None:
    container = stack.container("worker-kr-1")
    container.reload()
    if container.status != "running":
        container.start()


def _pause_kr(stack: ComposeStack) -> None:
    for name in ("worker-kr-1", "worker-kr-2"):
        _pause(stack.container(name))


def _pause(container: Any, attempts: int = 10) -> None:
    """runc's cgroup-v1 freezer gives up ("unable to freeze") when a process of the
    container is briefly unfreezable — e.g. a health check starting — so try again."""
    for attempt in range(attempts):
        try:
            container.pause()
            return
        except docker.errors.APIError as err:
            if "unable to freeze" not in str(err) or attempt == attempts - 1:
                raise
            time.sleep(0.2)


def _unpause_kr(stack: ComposeStack) -> None:
    for name in ("worker-kr-1", "worker-kr-2"):
        container = stack.container(name)
        container.reload()
        if container.status == "paused":
            container.unpause()


def _network(stack: ComposeStack) -> Any:
    return stack.engine.client.networks.get(f"{stack.project}_default")


def _disconnect_jp(stack: ComposeStack) -> None:
    _network(stack).disconnect(stack.container("worker-jp-1"))


def _connect_jp(stack: ComposeStack) -> None:
    _network(stack).connect(stack.container("worker-jp-1"), aliases=["worker-jp-1"])


def _restart_redis(stack: ComposeStack) -> None:
    stack.container("redis").restart(timeout=5)


def _nothing(stack: ComposeStack) -> None:
    return None


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("worker-killed", ("kr-1",), _kill, _restart_worker),
        Scenario("region-paused", ("kr-1", "kr-2"), _pause_kr, _unpause_kr),
        Scenario("region-disconnected", ("jp-1",), _disconnect_jp, _connect_jp),
        Scenario("redis-restarted", (), _restart_redis, _nothing),
    )
}


@dataclass
class Figures:
    scenario: str
    requests: int = 0
    failed: int = 0
    longest_gap_s: float = 0.0
    out_of_rotation_s: float | None = None
    back_in_rotation_s: float | None = None
    failures: list[str] = field(default_factory=list)

    def row(self) -> str:
        def s(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        return (
            f"{self.scenario:<20} {self.requests:>8} {self.failed:>6} {self.longest_gap_s:>12.2f}"
            f" {s(self.out_of_rotation_s):>15} {s(self.back_in_rotation_s):>15}"
        )


HEADER = (
    f"{'scenario':<20} {'requests':>8} {'failed':>6} {'longest gap s':>12}"
    f" {'out of rotation s':>15} {'back in rotation s':>15}"
)


class _Load:
    def __init__(self, *, url: str, key: str, clients: int, max_tokens: int) -> None:
        self.url = url
        self.key = key
        self.clients = clients
        self.max_tokens = max_tokens
        self.stop = asyncio.Event()
        self.requests = 0
        self.failures: list[str] = []
        self.longest_gap_s = 0.0

    async def run(self) -> None:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=120, sock_read=30)
        ) as http:
            await asyncio.gather(*(self._client(http) for _ in range(self.clients)))

    async def _client(self, http: aiohttp.ClientSession) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me about the weather in Seoul."}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        while not self.stop.is_set():
            self.requests += 1
            try:
                async with http.post(
                    f"{self.url}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {self.key}"},
                    json=body,
                ) as resp:
                    if resp.status != 200:
                        self.failures.append(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                        await asyncio.sleep(0.2)
                        continue
                    last = time.monotonic()
                    done = False
                    error = ""
                    async for line in resp.content:
                        now = time.monotonic()
                        self.longest_gap_s = max(self.longest_gap_s, now - last)
                        last = now
                        text = line.decode().strip()
                        if text == "data: [DONE]":
                            done = True
                        elif text.startswith("data: ") and '"error"' in text:
                            error = text[:200]
                    if error or not done:
                        self.failures.append(error or "stream ended without [DONE]")
            except (aiohttp.ClientError, TimeoutError) as err:
                self.failures.append(repr(err))


async def _rotation(stack: ComposeStack, debug_url: str) -> dict[str, bool]:
    token = stack.env["MERIDIAN_ROUTER_DEBUG_TOKEN"]
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http,
        http.get(f"{debug_url}/debug/view", headers={"Authorization": f"Bearer {token}"}) as r,
    ):
        view = json.loads(await r.text())
    return {w["worker_id"]: bool(w["healthy"]) for w in view.get("workers", [])}


async def _until(
    stack: ComposeStack, debug_url: str, targets: tuple[str, ...], healthy: bool, timeout_s: float
) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            view = await _rotation(stack, debug_url)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            view = {}
        if view and all(view.get(t) is healthy for t in targets):
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    return None


async def run_scenario(
    stack: ComposeStack,
    scenario: Scenario,
    *,
    key: str,
    debug_url: str,
    clients: int = 8,
    max_tokens: int = 64,
    warmup_s: float = 2.0,
    fault_s: float = 6.0,
    after_s: float = 4.0,
) -> Figures:
    """Load; inject the fault; keep it ``fault_s``; heal; keep loading ``after_s``."""
    load = _Load(url=stack.edge_url, key=key, clients=clients, max_tokens=max_tokens)
    runner = asyncio.get_running_loop().create_task(load.run())
    figures = Figures(scenario.name)
    try:
        await asyncio.sleep(warmup_s)
        try:
            await asyncio.to_thread(scenario.inject, stack)
        except BaseException:
            await asyncio.to_thread(scenario.heal, stack)  # what was injected, undone
            raise
        injected = time.monotonic()
        if scenario.targets:
            figures.out_of_rotation_s = await _until(
                stack, debug_url, scenario.targets, False, fault_s
            )
        await asyncio.sleep(max(0.0, fault_s - (time.monotonic() - injected)))
        await asyncio.to_thread(scenario.heal, stack)
        if scenario.targets:
            figures.back_in_rotation_s = await _until(
                stack, debug_url, scenario.targets, True, 30.0
            )
        await asyncio.sleep(after_s)
    finally:
        load.stop.set()
        await runner
    figures.requests = load.requests
    figures.failed = len(load.failures)
    figures.failures = load.failures[:5]
    figures.longest_gap_s = load.longest_gap_s
    return figures
