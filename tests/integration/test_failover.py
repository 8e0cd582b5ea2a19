"""Degraded paths on the real in-loop stack: dead workers, draining workers, busy regions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import openai
import pytest

from meridian.v1 import router_pb2, router_pb2_grpc, worker_pb2
from services.common.grpcutil import insecure_channel
from services.edge.upstream.failover import FailoverPolicy, open_stream
from services.edge.upstream.router_client import RouteResult
from services.netem.proxy import CutMode
from tests.integration.conftest import MODEL, Stack
from tests.support.stalls import LoopStalls


def client(stack: Stack) -> openai.AsyncOpenAI:
    """A client of the stack's edge; use it with ``async with`` so its connections close."""
    return openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.key, max_retries=0)


async def ask(stack: Stack) -> tuple[str, int]:
    async with client(stack) as c:
        raw = await c.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    raw.parse()
    return raw.headers["x-meridian-region"], int(raw.headers["x-meridian-attempts"])


async def test_a_dead_worker_is_skipped_before_the_router_notices(stack: Stack) -> None:
    # Cut kr's network: the router still lists kr first for a moment; the edge fails over.
    stack.proxies["kr-1"].cut(CutMode.REFUSE)
    region, attempts = await ask(stack)
    assert region != "kr"
    assert attempts in (1, 2)  # 2 if the router had not noticed yet


async def test_a_dead_worker_leaves_the_view_within_a_second(stack: Stack) -> None:
    await stack.workers["kr-1"].die()  # the process "dies"
    loop = asyncio.get_running_loop()
    start = loop.time()
    # The router shares this loop and does not age reports while the loop is held up (a
    # starved machine): that time is not its detection time.
    stalls = LoopStalls()
    while True:
        snaps = {s.worker_id: s for s in stack.router.fleet.snapshots(loop.time())}
        if not snaps["kr-1"].healthy:
            break
        waited = loop.time() - start
        if waited - stalls.held_s > 1.0 or waited > 10.0:
            stalls.stop()
            pytest.fail(f"kr-1 still healthy after 1 s (the loop was held up {stalls.held_s:.2f}s)")
        await asyncio.sleep(0.01)
    stalls.stop()
    for _ in range(5):
        region, _ = await ask(stack)
        assert region in ("jp", "us")


async def test_a_draining_worker_gets_no_new_traffic(stack: Stack) -> None:
    drain = asyncio.create_task(stack.workers["kr-1"].service.drain(grace_s=5.0))
    await asyncio.sleep(0.2)  # a load report or two
    for _ in range(3):
        region, _ = await ask(stack)
        assert region != "kr"
    await drain


async def test_route_explanation_changes_when_the_near_region_is_flooded(stack: Stack) -> None:
    async with insecure_channel(stack.router.address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        req = router_pb2.RouteRequest(request_id="probe", model=MODEL, explain=True)
        calm = await stub.Route(req)
        assert calm.candidates[0].region == "kr"
        assert {c.signal for c in calm.candidates[0].contributions}

        # Flood kr with long generations straight at the worker.
        kr = stack.workers["kr-1"]
        flood = [asyncio.create_task(_drain_stream(kr.address, i)) for i in range(64)]
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5.0
            busy = calm
            while loop.time() < deadline:
                busy = await stub.Route(req)
                if busy.candidates[0].region != "kr":
                    break
                await asyncio.sleep(0.05)
            assert busy.candidates[0].region != "kr", busy.explanation
            assert busy.explanation
        finally:
            for t in flood:
                t.cancel()
            await asyncio.gather(*flood, return_exceptions=True)


async def _drain_stream(address: str, i: int) -> None:
    from meridian.v1 import worker_pb2_grpc

    async with insecure_channel(address) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)
        req = worker_pb2.GenerateRequest(request_id=f"flood-{i}", model=MODEL)
        req.messages.add(role="user", content="flood " * 200)
        req.sampling.max_tokens = 4000
        req.sampling.ignore_eos = True
        async for _ in stub.Generate(req):
            pass


def attempts_of(
    template: worker_pb2.GenerateRequest,
) -> Callable[[str, str], worker_pb2.GenerateRequest]:
    """A Generate factory for ``open_stream``: a fresh copy of ``template`` per attempt."""

    def make(request_id: str, decision_id: str) -> worker_pb2.GenerateRequest:
        req = worker_pb2.GenerateRequest()
        req.CopyFrom(template)
        req.request_id, req.decision_id = request_id, decision_id
        return req

    return make


async def nothing_else(exclude: Sequence[str]) -> RouteResult:
    """A reroute that finds no other worker."""
    return RouteResult(decision_id="none", candidates=(), explanation="")


async def test_failover_tries_the_next_candidate_before_the_first_token(stack: Stack) -> None:
    """A candidate nobody listens on (a dead host) is skipped; the client never sees it."""
    from services.common.net import free_port

    dead = router_pb2.Candidate(
        worker_id="ghost-1", region="kr", address=f"127.0.0.1:{free_port()}"
    )
    live = router_pb2.Candidate(
        worker_id="jp-1",
        region="jp",
        address=f"{stack.proxies['jp-1'].host}:{stack.proxies['jp-1'].port}",
    )
    gen = worker_pb2.GenerateRequest(request_id="fo-1", model=MODEL)
    gen.messages.add(role="user", content="hello")
    gen.sampling.max_tokens = 3
    upstream = await open_stream(
        first_route=RouteResult(decision_id="d", candidates=(dead, live), explanation=""),
        reroute=nothing_else,
        outcomes=stack.edge.deps.router,
        workers=stack.edge.deps.workers,
        request_id="fo-1",
        generate=attempts_of(gen),
        policy=FailoverPolicy(max_attempts=3),
    )
    chunks = [c async for c in upstream.chunks()]
    assert upstream.candidate.worker_id == "jp-1"
    assert upstream.attempts == 2
    assert chunks[-1].usage.completion_tokens == 3


async def test_when_the_ranking_runs_out_the_router_is_asked_again_without_the_tried_worker(
    stack: Stack,
) -> None:
    """The stream stage never edits the route request: it calls ``reroute(exclude)``, which
    builds a fresh one; the router then ranks the remaining workers."""
    from services.common.net import free_port

    dead = router_pb2.Candidate(
        worker_id="ghost-2", region="kr", address=f"127.0.0.1:{free_port()}"
    )
    asked: list[tuple[str, ...]] = []

    async def reroute(exclude: Sequence[str]) -> RouteResult:
        asked.append(tuple(exclude))
        request = router_pb2.RouteRequest(
            request_id="rr-1", model=MODEL, exclude_worker_ids=[*exclude, "kr-1"]
        )
        return await stack.edge.deps.router.route(request)

    gen = worker_pb2.GenerateRequest(model=MODEL)
    gen.messages.add(role="user", content="hello")
    gen.sampling.max_tokens = 3
    upstream = await open_stream(
        first_route=RouteResult(decision_id="d", candidates=(dead,), explanation=""),
        reroute=reroute,
        outcomes=stack.edge.deps.router,
        workers=stack.edge.deps.workers,
        request_id="rr-1",
        generate=attempts_of(gen),
        policy=FailoverPolicy(max_attempts=3),
    )
    chunks = [c async for c in upstream.chunks()]
    assert asked == [("ghost-2",)]
    assert upstream.candidate.worker_id in ("jp-1", "us-1")  # kr-1 excluded by the reroute
    assert upstream.attempts == 2
    assert chunks[-1].usage.completion_tokens == 3


async def test_bad_requests_are_not_retried_on_other_workers(stack: Stack) -> None:
    from services.common.errors import InvalidRequest

    cands = tuple(
        router_pb2.Candidate(worker_id=name, region=name[:2], address=f"{p.host}:{p.port}")
        for name, p in stack.proxies.items()
    )
    gen = worker_pb2.GenerateRequest(request_id="fo-2", model=MODEL)
    gen.messages.add(role="user", content="hello")
    gen.sampling.max_tokens = 100_000  # over the context: every worker would refuse
    with pytest.raises(InvalidRequest) as exc:
        await open_stream(
            first_route=RouteResult(decision_id="d", candidates=cands, explanation=""),
            reroute=nothing_else,
            outcomes=stack.edge.deps.router,
            workers=stack.edge.deps.workers,
            request_id="fo-2",
            generate=attempts_of(gen),
            policy=FailoverPolicy(max_attempts=3),
        )
    assert exc.value.param == "max_tokens"


async def test_a_worker_that_stops_sending_mid_stream_ends_it_with_a_timeout(
    stack: Stack,
) -> None:
    """The link freezes after the first token (a silent partition): the edge's idle watchdog
    ends the stream with a clear error instead of hanging."""
    from services.common.errors import UpstreamTimeout

    proxy = stack.proxies["jp-1"]
    cand = router_pb2.Candidate(worker_id="jp-1", region="jp", address=f"{proxy.host}:{proxy.port}")
    gen = worker_pb2.GenerateRequest(request_id="idle-1", model=MODEL)
    gen.messages.add(role="user", content="hello")
    gen.sampling.max_tokens = 5000
    gen.sampling.ignore_eos = True
    upstream = await open_stream(
        first_route=RouteResult(decision_id="d", candidates=(cand,), explanation=""),
        reroute=nothing_else,
        outcomes=stack.edge.deps.router,
        workers=stack.edge.deps.workers,
        request_id="idle-1",
        generate=attempts_of(gen),
        policy=FailoverPolicy(stream_idle_timeout_s=0.5),
    )
    chunks = upstream.chunks()
    await anext(chunks)
    proxy.cut(CutMode.BLACKHOLE, reset_existing=False)  # freeze: nothing more arrives
    with pytest.raises(UpstreamTimeout):
        async for _ in chunks:
            pass
    proxy.restore()
