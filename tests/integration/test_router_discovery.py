"""Discovery on live workers: a DNS name (the system resolver, and a table that scales), and
workers announcing themselves through their ready files (a real worker process). Each source
must bring a new worker into traffic within seconds, and a dead one must stop receiving
traffic within a second.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from meridian.v1 import router_pb2
from services.common.clock import SYSTEM_CLOCK
from services.router.discovery.dns import DnsTarget
from services.worker.sim import SimEngine
from tests.support.inproc import RunningRouter, RunningWorker, start_router, start_worker
from tests.support.regions import MODEL, Refused, RouterCaller, sim
from tests.support.resolver import TableResolver
from tests.support.stalls import LoopStalls
from tests.support.wait import eventually

REPO = Path(__file__).resolve().parents[2]


def healthy(router: RunningRouter) -> set[str]:
    return {s.worker_id for s in router.fleet.snapshots(SYSTEM_CLOCK.monotonic()) if s.healthy}


def listed(router: RunningRouter) -> set[str]:
    return {s.worker_id for s in router.fleet.snapshots(SYSTEM_CLOCK.monotonic())}


async def served_by(caller: RouterCaller, region: str) -> str | None:
    """The worker a request pinned to ``region`` would go to now (None: refused)."""
    resp = await caller.route(allowed_regions=[region])
    return None if isinstance(resp, Refused) else resp.candidates[0].worker_id


async def seconds_until(predicate: Callable[[], Awaitable[bool]], *, timeout_s: float) -> float:
    """Seconds until ``predicate()`` holds (polled every 10 ms), less the time this event loop
    was held up meanwhile: the router and workers share it, and a starved machine's lost time
    is not theirs. Gives up ``timeout_s`` after (and at most 5× that on the wall clock)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    stalls = LoopStalls()
    try:
        while True:
            if await predicate():
                return loop.time() - start - stalls.held_s
            waited = loop.time() - start
            if waited - stalls.held_s > timeout_s or waited > 5 * timeout_s:
                raise TimeoutError(f"not within {timeout_s}s")
            await asyncio.sleep(0.01)
    finally:
        stalls.stop()


@pytest.fixture
async def kr_worker() -> AsyncIterator[RunningWorker]:
    w = await start_worker(SimEngine(sim()), worker_id="kr-1", region="kr")
    yield w
    await w.stop()


async def test_a_dns_name_resolved_by_the_system_brings_its_workers(
    kr_worker: RunningWorker,
) -> None:
    port = int(kr_worker.address.rsplit(":", 1)[1])
    router = await start_router([], dns=[DnsTarget("localhost", port)], dns_interval_s=0.2)
    caller = RouterCaller(router.address)
    try:
        await router.wait_healthy(1)
        assert router.fleet.address_of("kr-1") == f"127.0.0.1:{port}"
        assert await served_by(caller, "kr") == "kr-1"
        assert router.discovery.membership.sources() == {
            f"dns:localhost:{port}": frozenset({f"127.0.0.1:{port}"})
        }
    finally:
        await caller.close()
        await router.stop()


async def test_a_worker_added_to_a_dns_name_gets_traffic_and_leaves_when_dead(
    kr_worker: RunningWorker,
) -> None:
    port = int(kr_worker.address.rsplit(":", 1)[1])
    resolver = TableResolver()
    resolver.table["workers"] = ["127.0.0.1"]
    router = await start_router(
        [], dns=[DnsTarget("workers", port)], dns_interval_s=0.1, resolver=resolver
    )
    caller = RouterCaller(router.address)
    try:
        await router.wait_healthy(1)
        assert await served_by(caller, "jp") is None

        # Scale up: a jp worker on another loopback address, same port, same name.
        jp = await start_worker(
            SimEngine(sim()), worker_id="jp-1", region="jp", host="127.0.0.2", port=port
        )
        resolver.table["workers"] = ["127.0.0.1", "127.0.0.2"]

        async def jp_serves() -> bool:
            return await served_by(caller, "jp") == "jp-1"

        joined_after = await seconds_until(jp_serves, timeout_s=5.0)
        assert joined_after < 5.0

        await jp.die()  # dies; DNS still lists it

        async def jp_refused() -> bool:
            return await served_by(caller, "jp") is None

        gone_after = await seconds_until(jp_refused, timeout_s=2.0)
        assert gone_after < 1.0, f"jp-1 still routed {gone_after:.2f}s after it died"
        await jp.engine.shutdown()

        resolver.table["workers"] = ["127.0.0.1"]  # scaled down: it leaves the view
        await eventually(lambda: listed(router) == {"kr-1"})
    finally:
        await caller.close()
        await router.stop()


async def test_a_worker_announcing_itself_gets_traffic_and_leaves_when_dead(
    tmp_path: Path, kr_worker: RunningWorker
) -> None:
    """A real worker process writes its ready file into the announcement directory."""
    announce = tmp_path / "workers"
    announce.mkdir()
    router = await start_router([kr_worker.address], announce_dir=announce, announce_interval_s=0.1)
    caller = RouterCaller(router.address)
    log = (tmp_path / "jp-9.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *[
            sys.executable,
            "-m",
            "services.worker",
            "--worker-id",
            "jp-9",
            "--region",
            "jp",
            "--engine",
            "sim",
            "--model",
            MODEL,
            "--report-interval-ms",
            "50",
            "--ready-file",
            str(announce / "jp-9.json"),
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        await router.wait_healthy(1)

        async def jp_serves() -> bool:
            return await served_by(caller, "jp") == "jp-9"

        await seconds_until(jp_serves, timeout_s=30.0)  # includes the process starting
        ready = json.loads((announce / "jp-9.json").read_text())
        assert router.fleet.address_of("jp-9") == f"127.0.0.1:{ready['port']}"

        proc.send_signal(signal.SIGKILL)  # no clean exit: the file stays behind

        async def jp_refused() -> bool:
            return await served_by(caller, "jp") is None

        gone_after = await seconds_until(jp_refused, timeout_s=2.0)
        assert gone_after < 1.0, f"jp-9 still routed {gone_after:.2f}s after it was killed"
        assert "jp-9" in listed(router)  # still a member (its file is there), but down

        (announce / "jp-9.json").unlink()
        await eventually(lambda: listed(router) == {"kr-1"})
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        log.close()
        await caller.close()
        await router.stop()


async def test_every_refusal_while_a_worker_is_missing_is_a_clear_status(
    kr_worker: RunningWorker,
) -> None:
    router = await start_router([kr_worker.address])
    caller = RouterCaller(router.address)
    try:
        await router.wait_healthy(1)
        refusal = await caller.route(allowed_regions=["jp"])
        assert isinstance(refusal, Refused)
        assert refusal.code is grpc.StatusCode.FAILED_PRECONDITION
        resp = await caller.route(model=MODEL, priority=router_pb2.PRIORITY_LOW)
        assert not isinstance(resp, Refused)
    finally:
        await caller.close()
        await router.stop()
