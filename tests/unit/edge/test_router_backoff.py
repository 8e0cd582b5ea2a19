"""A router that does not answer is backed off: requests are ranked from its last view without
waiting for it, one probe asks it, and it is asked again once it answers (the module docstring
of services/edge/upstream/resilient_router.py).

The router here is a real gRPC server whose handlers can hang — they accept the call and wait,
as a SIGSTOPped router's kernel accepts the connection — and resume when it answers again, as
that router does on SIGCONT. The tests count the calls it receives, never the time they take.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from meridian.v1 import router_pb2, router_pb2_grpc, worker_pb2
from services.common.clock import ManualClock
from services.common.errors import Overloaded
from services.common.grpcutil import new_server
from services.edge.counters import EdgeCounters
from services.edge.upstream.resilient_router import ResilientRouter, ViewConfig, models_from_view
from services.edge.upstream.router_client import RouterClient
from tests.support.wait import eventually

REQUEST = router_pb2.RouteRequest(model="m")
ROUTEVIEW_LOG = "meridian.edge.routeview"


def fleet_view() -> router_pb2.RouterView:
    view = router_pb2.RouterView(router_site="test")
    for wid, region, rtt in (("kr1", "kr", 2.0), ("jp1", "jp", 80.0)):
        w = view.workers.add(
            worker_id=wid, region=region, address=f"{wid}:1", healthy=True, rtt_ms=rtt
        )
        w.load.max_running = 10
        w.load.models.add(name="m", state=worker_pb2.MODEL_STATE_READY, max_model_len=4096)
    return view


class HangingRouter(router_pb2_grpc.RouterServicer):
    """Answers, refuses (Route: no capacity; GetView: an internal error), or hangs."""

    def __init__(self) -> None:
        self.view = fleet_view()
        self.refusing = False
        self.awake = asyncio.Event()
        self.awake.set()
        self.routes = 0  # Route requests received (on the stream)
        self.models = 0
        self.views = 0
        self.views_in_flight = 0
        self.most_views_in_flight = 0

    def hang(self) -> None:
        self.awake.clear()

    def answer(self, *, refusing: bool = False) -> None:
        self.refusing = refusing
        self.awake.set()

    async def RouteStream(
        self,
        request_iterator: AsyncIterator[router_pb2.RouteStreamRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[router_pb2.RouteStreamResponse]:
        calls: asyncio.Queue[int | None] = asyncio.Queue()

        async def read() -> None:  # counted as they arrive, even while hung
            async for msg in request_iterator:
                if msg.call_id:
                    self.routes += 1
                    calls.put_nowait(msg.call_id)
            calls.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (call_id := await calls.get()) is not None:
                await self.awake.wait()
                yield self._answer(call_id)
        finally:
            reader.cancel()

    def _answer(self, call_id: int) -> router_pb2.RouteStreamResponse:
        if self.refusing:
            err = Overloaded("no capacity for 'm'", retry_after_s=1.0)
            return router_pb2.RouteStreamResponse(
                call_id=call_id,
                code=err.grpc_code.value[0],
                message=err.message,
                trailers=dict(err.grpc_trailers()),
            )
        answer = router_pb2.RouteStreamResponse(call_id=call_id)
        answer.response.decision_id = f"d{call_id}"
        answer.response.candidates.add(worker_id="kr1", region="kr", address="kr1:1")
        return answer

    async def GetView(
        self, request: router_pb2.GetViewRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> router_pb2.RouterView:
        self.views += 1
        self.views_in_flight += 1
        self.most_views_in_flight = max(self.most_views_in_flight, self.views_in_flight)
        try:
            await self.awake.wait()
        finally:
            self.views_in_flight -= 1
        if self.refusing:
            await context.abort(grpc.StatusCode.INTERNAL, "view unavailable")
        return self.view

    async def ListModels(
        self, request: router_pb2.ListModelsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> router_pb2.ListModelsResponse:
        self.models += 1
        await self.awake.wait()
        return models_from_view(self.view)


@dataclass
class Setup:
    servicer: HangingRouter
    router: ResilientRouter
    counters: EdgeCounters
    address: str
    clock: ManualClock


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    servicer = HangingRouter()
    server = new_server()
    router_pb2_grpc.add_RouterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    counters = EdgeCounters()
    clock = ManualClock()
    router = ResilientRouter(
        client=RouterClient(f"127.0.0.1:{port}", timeout_s=0.3),
        clock=clock,
        counters=counters,
        config=ViewConfig(backoff_initial_s=0.2, backoff_max_s=0.4, backoff_after=1),
    )
    await router.refresh()  # the view it falls back to
    try:
        yield Setup(servicer, router, counters, f"127.0.0.1:{port}", clock)
    finally:
        servicer.answer()  # let hung handlers end
        await router.close()
        await server.stop(None)


def events(caplog: pytest.LogCaptureFixture, name: str) -> int:
    return sum(r.getMessage() == name for r in caplog.records if r.name == ROUTEVIEW_LOG)


async def test_after_a_timeout_requests_are_routed_from_the_view_without_asking_the_router(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ROUTEVIEW_LOG)
    router, servicer, counters = setup.router, setup.servicer, setup.counters
    servicer.hang()
    first = await router.route(REQUEST)  # waits the deadline, once
    assert first.decision_id.startswith("local-")
    later = [await router.route(REQUEST) for _ in range(5)]
    assert [r.decision_id[:6] for r in later] == ["local-"] * 5
    assert servicer.routes == 1  # the router was not asked again
    models = await router.list_models()  # /v1/models is not held up either
    assert [m.name for m in models.models] == ["m"]
    assert servicer.models == 0
    assert router.backed_off
    assert (counters.router_unreachable, counters.route_fallback_used) == (1, 6)
    assert counters.route_fallback_backed_off == 5
    assert events(caplog, "router.backoff_started") == 1


async def test_a_burst_of_model_listings_is_one_router_call_a_second(setup: Setup) -> None:
    """/v1/models from many callers at once waits on one call; within ``models_fresh_s`` the
    answer is reused; after it the router is asked again, and a caller that gives up does not
    cancel the call the others are waiting on."""
    router, servicer = setup.router, setup.servicer
    servicer.hang()
    waiting = [asyncio.create_task(router.list_models()) for _ in range(20)]
    await eventually(lambda: servicer.models == 1)
    waiting[0].cancel()  # one client goes away
    servicer.answer()
    answers = await asyncio.gather(*waiting[1:])
    assert {tuple(m.name for m in a.models) for a in answers} == {("m",)}
    assert servicer.models == 1
    setup.clock.advance(0.9)
    await router.list_models()
    assert servicer.models == 1  # still fresh
    setup.clock.advance(0.2)
    servicer.view.workers[0].load.models.add(name="new", state=worker_pb2.MODEL_STATE_READY)
    listed = await router.list_models()
    assert servicer.models == 2
    assert "new" in {m.name for m in listed.models}


async def test_one_probe_asks_a_hung_router_and_requests_do_not_wait_for_it(
    setup: Setup,
) -> None:
    router, servicer = setup.router, setup.servicer
    servicer.hang()
    await router.route(REQUEST)
    await eventually(lambda: servicer.views_in_flight == 1, timeout_s=10.0)  # a probe waits
    routed = await router.route(REQUEST)  # meanwhile: from the view, at once
    assert routed.decision_id.startswith("local-")
    assert servicer.views_in_flight == 1  # the probe is still waiting
    await eventually(lambda: servicer.views >= 4, timeout_s=10.0)  # the first view + 3 probes
    assert servicer.most_views_in_flight == 1
    assert servicer.routes == 1
    assert router.backed_off


async def test_when_the_router_answers_again_requests_go_through_it(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ROUTEVIEW_LOG)
    router, servicer, counters = setup.router, setup.servicer, setup.counters
    servicer.hang()
    await router.route(REQUEST)
    await router.route(REQUEST)
    assert servicer.routes == 1
    servicer.answer()  # SIGCONT: it answers what it had, and the probe
    await eventually(lambda: not router.backed_off, timeout_s=10.0)
    routed = [await router.route(REQUEST) for _ in range(3)]
    assert [r.decision_id for r in routed] == ["d2", "d3", "d4"]  # the router's own
    assert servicer.routes == 4
    assert counters.route_fallback_used == 2
    assert (events(caplog, "router.backoff_started"), events(caplog, "router.back")) == (1, 1)


async def test_a_router_that_answers_with_an_error_is_obeyed_and_not_backed_off(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ROUTEVIEW_LOG)
    router, servicer, counters = setup.router, setup.servicer, setup.counters
    servicer.answer(refusing=True)
    for _ in range(3):
        with pytest.raises(Overloaded):
            await router.route(REQUEST)
    assert servicer.routes == 3  # asked every time
    assert not router.backed_off
    assert (counters.router_unreachable, counters.route_fallback_used) == (0, 0)
    assert counters.route_fallback_backed_off == 0
    # After a hang, a probe answered with an error ends the backoff too: the router is there,
    # and its verdicts are obeyed again.
    servicer.hang()
    assert (await router.route(REQUEST)).decision_id.startswith("local-")
    assert counters.router_unreachable == 1
    servicer.answer(refusing=True)
    await eventually(lambda: not router.backed_off, timeout_s=10.0)
    with pytest.raises(Overloaded):
        await router.route(REQUEST)
    assert servicer.routes == 5
    assert events(caplog, "router.backoff_started") == 1


async def test_one_unanswered_call_alone_does_not_start_the_backoff(setup: Setup) -> None:
    """By default two in a row do: one may be a slow answer on a busy host, and the view a
    backoff routes from may be seconds old (a worker that just began draining looks ready)."""
    servicer = setup.servicer
    router = ResilientRouter(
        client=RouterClient(setup.address, timeout_s=0.3),
        clock=ManualClock(),
        counters=EdgeCounters(),
        config=ViewConfig(backoff_initial_s=0.2, backoff_max_s=0.4),  # backoff_after: 2
    )
    await router.refresh()
    try:
        await _two_in_a_row_back_off(router, servicer)
    finally:
        servicer.answer()
        await router.close()


async def _two_in_a_row_back_off(router: ResilientRouter, servicer: HangingRouter) -> None:
    routes = servicer.routes
    states: list[bool] = []
    servicer.hang()
    assert (await router.route(REQUEST)).decision_id.startswith("local-")
    states.append(router.backed_off)
    servicer.answer()
    assert not (await router.route(REQUEST)).decision_id.startswith("local-")  # asked again
    servicer.hang()
    await router.route(REQUEST)
    states.append(router.backed_off)  # the answer in between reset the count
    await router.route(REQUEST)
    states.append(router.backed_off)  # two in a row
    assert states == [False, False, True]
    assert servicer.routes - routes == 4
