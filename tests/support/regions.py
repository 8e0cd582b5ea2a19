"""Regions of simulated workers behind real delay proxies, routers watching them, and a caller
that does what the edge does — Route, Generate on the primary, ReportOutcome — for the router's
scenario tests. Everything runs in the test's event loop over real sockets on 127.0.0.1.

Load that the router did not route (``Hold``: long generations sent straight to a worker)
stands for traffic from other edge sites: the router only learns of it from load reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from meridian.v1 import router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.common.clock import SYSTEM_CLOCK
from services.common.errors import RETRY_AFTER_KEY
from services.common.grpcutil import insecure_channel
from services.edge.openai_types import ChatCompletionRequest
from services.edge.prompt import estimate_prompt_tokens, prefix_hashes
from services.netem.config import LinkProfile, Route
from services.netem.proxy import DelayProxy
from services.router.scheduling.types import WorkerSnapshot
from services.worker.sim import SimConfig, SimEngine
from tests.support.inproc import RunningRouter, RunningWorker, start_router, start_worker
from tests.support.wait import eventually

MODEL = "meridian-sim"


@dataclass(frozen=True, slots=True)
class RegionSpec:
    name: str
    one_way_ms: float  # the router measures twice this as RTT
    workers: int = 1


def sim(**over: Any) -> SimConfig:
    base: dict[str, Any] = {"models": [MODEL], "output_len_min": 4, "output_len_max": 12}
    base.update(over)
    return SimConfig.from_mapping(base)


async def delay_proxy(worker: RunningWorker, one_way_ms: float) -> DelayProxy:
    """A delay proxy in front of ``worker``: what a router at some site sees of it."""
    host, port = worker.address.rsplit(":", 1)
    proxy = DelayProxy(
        Route(
            name=worker.worker_id,
            upstream_host=host,
            upstream_port=int(port),
            link=LinkProfile(delay_ms=one_way_ms),
        )
    )
    await proxy.start()
    return proxy


@dataclass
class Regions:
    workers: dict[str, RunningWorker]  # worker id → worker
    proxies: dict[str, DelayProxy]  # worker id → its proxy (what the router dials)
    router: RunningRouter
    extra: list[DelayProxy] = field(default_factory=list)

    def proxied(self, worker_id: str) -> str:
        p = self.proxies[worker_id]
        return f"{p.host}:{p.port}"

    def in_region(self, region: str) -> list[RunningWorker]:
        return [w for w in self.workers.values() if w.region == region]

    def view(self) -> dict[str, WorkerSnapshot]:
        return {s.worker_id: s for s in self.router.fleet.snapshots(SYSTEM_CLOCK.monotonic())}

    async def stop(self) -> None:
        await self.router.stop()
        for proxy in [*self.proxies.values(), *self.extra]:
            await proxy.close()
        for w in self.workers.values():
            with contextlib.suppress(Exception):  # some tests stop workers themselves
                await w.stop()


async def start_regions(
    specs: Sequence[RegionSpec], *, config: SimConfig, **router_kwargs: Any
) -> Regions:
    """Workers ``<region>-<i>`` behind one delay proxy each, and a router watching the proxies
    (so it measures the delay). Waits until the router sees every worker healthy."""
    workers: dict[str, RunningWorker] = {}
    proxies: dict[str, DelayProxy] = {}
    async with contextlib.AsyncExitStack() as started:  # a failed start stops what it started
        for spec in specs:
            for i in range(1, spec.workers + 1):
                name = f"{spec.name}-{i}"
                w = await start_worker(SimEngine(config), worker_id=name, region=spec.name)
                started.push_async_callback(w.stop)
                workers[name] = w
                proxies[name] = await delay_proxy(w, spec.one_way_ms)
                started.push_async_callback(proxies[name].close)
        router_kwargs.setdefault("probe_interval_s", 0.05)
        router = await start_router(
            [f"{p.host}:{p.port}" for p in proxies.values()], **router_kwargs
        )
        started.push_async_callback(router.stop)
        await router.wait_healthy(len(workers))
        regions = Regions(workers, proxies, router)
        expected = {f"{s.name}-{i}": s.one_way_ms for s in specs for i in range(1, s.workers + 1)}
        await settled(regions, expected)
        started.pop_all()  # up: from here Regions.stop stops it
    return regions


async def settled(regions: Regions, one_way_ms: dict[str, float], slack_ms: float = 10.0) -> None:
    """Until the router's smoothed RTT of each worker is within ``slack_ms`` of the emulated
    one: the first probes of a connection, taken while the test is still starting things,
    can be outliers that the EWMA takes a few probes to forget."""

    def close_enough() -> bool:
        view = regions.view()
        return all(
            (rtt := view[w].rtt_ms) is not None and rtt <= 2 * d + slack_ms
            for w, d in one_way_ms.items()
        )

    await eventually(close_enough, timeout_s=10.0)


# --- what the edge does -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Served:
    decision_id: str
    worker_id: str
    region: str
    ttft_s: float  # Route call included, as the client sees it
    queue_ms: float  # engine-side: arrival to first scheduled
    prompt_tokens: int
    cached_prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Refused:
    code: grpc.StatusCode
    details: str
    retry_after_ms: int | None


def refused(err: grpc.aio.AioRpcError) -> Refused:
    retry = None
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            retry = int(value)
    return Refused(err.code(), err.details() or "", retry)


def chat(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


class RouterCaller:
    """Route → Generate on the primary candidate → ReportOutcome, as the edge does (without
    its failover: scenario tests want to see the router's first choice)."""

    def __init__(self, router_address: str, *, edge_site: str = "test") -> None:
        self._channel = insecure_channel(router_address)
        self._router = router_pb2_grpc.RouterStub(self._channel)
        self._edge_site = edge_site
        self._workers: dict[str, tuple[grpc.aio.Channel, worker_pb2_grpc.WorkerStub]] = {}
        self._n = 0

    async def route(
        self, *, follow_up: bool = False, **fields: Any
    ) -> router_pb2.RouteResponse | Refused:
        """Ask the router. Without ``follow_up`` nothing will be sent to the chosen worker, so the
        decision is reported cancelled at once (as the edge does when a client leaves before
        its Generate): the router must not keep counting it as in flight."""
        fields.setdefault("model", MODEL)
        fields.setdefault("request_id", self._next_id())
        try:
            resp: router_pb2.RouteResponse = await self._router.Route(
                router_pb2.RouteRequest(edge_site=self._edge_site, **fields), timeout=5.0
            )
        except grpc.aio.AioRpcError as err:
            return refused(err)
        if not follow_up:
            await self.report(resp, router_pb2.OUTCOME_CANCELLED)
        return resp

    async def report(self, resp: router_pb2.RouteResponse, outcome: router_pb2.Outcome) -> None:
        """Tell the router how the attempt on ``resp``'s primary candidate ended."""
        await self._router.ReportOutcome(
            router_pb2.OutcomeReport(
                decision_id=resp.decision_id,
                worker_id=resp.candidates[0].worker_id,
                outcome=outcome,
            ),
            timeout=5.0,
        )

    async def report_batch(self, reports: list[router_pb2.OutcomeReport]) -> None:
        await self._router.ReportOutcomes(router_pb2.OutcomeBatch(reports=reports), timeout=5.0)

    async def ask(
        self,
        messages: list[dict[str, str]],
        *,
        priority: int = router_pb2.PRIORITY_STANDARD,
        allowed_regions: Sequence[str] = (),
        max_tokens: int = 8,
        ignore_eos: bool = True,
    ) -> Served | Refused:
        """One request end to end; the prompt's prefix hashes are the edge's."""
        body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages})
        request_id = self._next_id()
        started = time.perf_counter()
        decision = await self.route(
            follow_up=True,
            request_id=request_id,
            priority=priority,
            allowed_regions=list(allowed_regions),
            prompt_tokens=estimate_prompt_tokens(body),
            max_tokens=max_tokens,
            prefix_hashes=prefix_hashes(body),
        )
        if isinstance(decision, Refused):
            return decision
        cand = decision.candidates[0]
        gen = worker_pb2.GenerateRequest(
            request_id=request_id,
            model=MODEL,
            priority=priority,
            decision_id=decision.decision_id,
        )
        for m in messages:
            gen.messages.add(role=m["role"], content=m["content"])
        gen.sampling.max_tokens = max_tokens
        gen.sampling.ignore_eos = ignore_eos
        ttft = queue_ms = 0.0
        usage = worker_pb2.Usage()
        outcome = router_pb2.OUTCOME_FAILED
        try:
            async for chunk in self._worker(cand.address).Generate(gen, timeout=30.0):
                if not ttft:
                    ttft = time.perf_counter() - started
                    queue_ms = chunk.timings.queue_ms
                usage = chunk.usage
            outcome = router_pb2.OUTCOME_SUCCESS
        finally:
            await self._router.ReportOutcome(
                router_pb2.OutcomeReport(
                    decision_id=decision.decision_id,
                    worker_id=cand.worker_id,
                    outcome=outcome,
                    ttft_ms=ttft * 1000,
                    completion_tokens=usage.completion_tokens,
                ),
                timeout=5.0,
            )
        return Served(
            decision.decision_id,
            cand.worker_id,
            cand.region,
            ttft,
            queue_ms,
            usage.prompt_tokens,
            usage.cached_prompt_tokens,
        )

    def _worker(self, address: str) -> worker_pb2_grpc.WorkerStub:
        entry = self._workers.get(address)
        if entry is None:
            channel = insecure_channel(address)
            entry = (channel, worker_pb2_grpc.WorkerStub(channel))
            self._workers[address] = entry
        return entry[1]

    def _next_id(self) -> str:
        self._n += 1
        return f"req-{self._n}"

    async def close(self) -> None:
        await self._channel.close(grace=None)
        for channel, _ in self._workers.values():
            await channel.close(grace=None)


class Hold:
    """``n`` long generations sent straight to one worker, kept running until released."""

    def __init__(self, tasks: list[asyncio.Task[None]], channel: grpc.aio.Channel) -> None:
        self._tasks = tasks
        self._channel = channel

    @classmethod
    async def start(cls, address: str, n: int, *, tag: str = "hold") -> Hold:
        channel = insecure_channel(address)
        stub = worker_pb2_grpc.WorkerStub(channel)
        started: list[asyncio.Event] = [asyncio.Event() for _ in range(n)]

        async def one(i: int) -> None:
            req = worker_pb2.GenerateRequest(request_id=f"{tag}-{i}", model=MODEL)
            req.messages.add(role="user", content=f"{tag} {i}")
            req.sampling.max_tokens = 4000
            req.sampling.ignore_eos = True
            async for _ in stub.Generate(req):
                started[i].set()

        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        hold = cls(tasks, channel)
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 10.0)
        except BaseException:
            await hold.release()
            raise
        return hold

    async def release(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._channel.close(grace=None)


async def until_running(regions: Regions, worker_id: str, running: int) -> None:
    """Until the router's view shows ``worker_id`` with at least ``running`` sequences."""
    await eventually(lambda: regions.view()[worker_id].running >= running, timeout_s=10.0)
