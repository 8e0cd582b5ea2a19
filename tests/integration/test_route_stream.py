"""The edge's RouterClient over RouteStream: the router's answers and errors are what unary
Route gives, outcomes ride the stream, a broken stream is "router unreachable" and is reopened,
and a router without RouteStream is asked with unary calls."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from meridian.v1 import router_pb2, router_pb2_grpc
from services.common.clock import SYSTEM_CLOCK
from services.common.errors import InvalidRequest, ModelNotFound, from_grpc
from services.common.grpcutil import insecure_channel, new_server
from services.edge.upstream.router_client import RouterClient, RouterUnreachable
from services.worker.sim import SimConfig, SimEngine
from tests.support.inproc import start_router, start_worker
from tests.support.wait import eventually


async def _unary_error(address: str, request: router_pb2.RouteRequest) -> Exception:
    channel = insecure_channel(address)
    try:
        await router_pb2_grpc.RouterStub(channel).Route(request, timeout=2.0)
    except grpc.aio.AioRpcError as err:
        return from_grpc(err.code(), err.details(), err.trailing_metadata())
    finally:
        await channel.close()
    raise AssertionError("unary Route did not fail")


async def test_the_stream_answers_and_refuses_as_unary_route_does() -> None:
    worker = await start_worker(SimEngine(SimConfig()), worker_id="w1", region="kr")
    router = await start_router([worker.address])
    client = RouterClient(router.address)
    try:
        await router.wait_healthy(1)
        result = await client.route(router_pb2.RouteRequest(request_id="r1", model="meridian-sim"))
        assert [c.worker_id for c in result.candidates] == ["w1"]
        assert result.decision_id
        assert result.explanation
        (entry,) = router.service.journal.for_request("r1")
        assert entry.decision_id == result.decision_id  # decided and journaled once

        for request, kind in (
            (router_pb2.RouteRequest(request_id="r2", model="no-such-model"), ModelNotFound),
            (router_pb2.RouteRequest(request_id="r3", model=""), InvalidRequest),
        ):
            with pytest.raises(kind) as streamed:
                await client.route(request)
            unary = await _unary_error(router.address, request)
            assert type(unary) is kind
            assert streamed.value.message == unary.message
            assert streamed.value.param == unary.param
        # The stream survived the refusals.
        again = await client.route(router_pb2.RouteRequest(request_id="r4", model="meridian-sim"))
        assert again.candidates[0].worker_id == "w1"
    finally:
        await client.close()
        await router.stop()
        await worker.stop()


async def test_outcomes_ride_the_stream_with_the_next_request() -> None:
    worker = await start_worker(SimEngine(SimConfig()), worker_id="w1", region="kr")
    router = await start_router([worker.address], report_interval_ms=10_000)
    client = RouterClient(router.address, outcome_flush_s=60.0)  # never by the timer
    try:
        await router.wait_healthy(1)
        first = await client.route(router_pb2.RouteRequest(request_id="a", model="meridian-sim"))
        client.report_outcome(
            router_pb2.OutcomeReport(
                decision_id=first.decision_id,
                worker_id="w1",
                outcome=router_pb2.OUTCOME_FAILED,
            )
        )
        await client.route(router_pb2.RouteRequest(request_id="b", model="meridian-sim"))
        (snap,) = router.fleet.snapshots(SYSTEM_CLOCK.monotonic())
        assert snap.recent_failures == 1  # applied before "b" was decided
        assert snap.in_flight == 1  # only "b"
    finally:
        await client.close()
        await router.stop()
        await worker.stop()


async def test_malformed_outcomes_are_refused_by_name_or_dropped_from_the_stream() -> None:
    """An unknown outcome used to release its in-flight slot as a success would; a NaN TTFT
    or an empty id was taken as well. Unary calls answer INVALID_ARGUMENT naming the field;
    on RouteStream the bad report is dropped and counted, and the stream goes on."""
    worker = await start_worker(SimEngine(SimConfig()), worker_id="w1", region="kr")
    router = await start_router([worker.address], report_interval_ms=10_000)
    client = RouterClient(router.address, outcome_flush_s=60.0)
    channel = insecure_channel(router.address)
    stub = router_pb2_grpc.RouterStub(channel)
    try:
        await router.wait_healthy(1)
        first = await client.route(router_pb2.RouteRequest(request_id="a", model="meridian-sim"))
        bad = router_pb2.OutcomeReport(decision_id=first.decision_id, worker_id="w1")
        bad.outcome = 99  # type: ignore[assignment]  # an enum value this build does not know
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await stub.ReportOutcome(bad, timeout=2.0)
        assert unary.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert unary.value.details() == "unknown outcome 99"
        nan = router_pb2.OutcomeReport(
            decision_id=first.decision_id,
            worker_id="w1",
            outcome=router_pb2.OUTCOME_SUCCESS,
            ttft_ms=float("nan"),
        )
        with pytest.raises(grpc.aio.AioRpcError) as batch:
            await stub.ReportOutcomes(router_pb2.OutcomeBatch(reports=[nan, nan]), timeout=2.0)
        assert batch.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        refused = from_grpc(
            batch.value.code(), batch.value.details(), batch.value.trailing_metadata()
        )
        assert refused.param == "reports[0].ttft_ms"
        (snap,) = router.fleet.snapshots(SYSTEM_CLOCK.monotonic())
        assert snap.in_flight == 1  # none of them released "a"

        client.report_outcome(bad)
        await client.route(router_pb2.RouteRequest(request_id="b", model="meridian-sim"))
        (snap,) = router.fleet.snapshots(SYSTEM_CLOCK.monotonic())
        assert snap.in_flight == 2  # "a" still held, "b" added: the stream went on
        assert router.service.telemetry.refused_outcomes == {"outcome": 2, "ttft_ms": 1}
    finally:
        await channel.close()
        await client.close()
        await router.stop()
        await worker.stop()


async def test_a_broken_stream_is_unreachable_and_the_next_call_reopens_it() -> None:
    worker = await start_worker(SimEngine(SimConfig()), worker_id="w1", region="kr")
    router = await start_router([worker.address])
    port = router.server.port
    client = RouterClient(router.address, timeout_s=1.0)
    try:
        await router.wait_healthy(1)
        await client.route(router_pb2.RouteRequest(request_id="a", model="meridian-sim"))
        await router.stop()
        with pytest.raises(RouterUnreachable):
            await client.route(router_pb2.RouteRequest(request_id="b", model="meridian-sim"))
        router = await start_router([worker.address], listen=f"127.0.0.1:{port}")
        await router.wait_healthy(1)

        async def routed() -> bool:
            try:
                await client.route(router_pb2.RouteRequest(request_id="c", model="meridian-sim"))
            except RouterUnreachable:
                return False
            return True

        for _ in range(50):
            if await routed():
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the client never reached the restarted router")
    finally:
        await client.close()
        await router.stop()
        await worker.stop()


class _UnaryOnlyRouter(router_pb2_grpc.RouterServicer):
    """A router from before RouteStream: Route and ReportOutcomes only."""

    def __init__(self) -> None:
        self.routes = 0
        self.outcomes: list[str] = []

    async def Route(
        self, request: router_pb2.RouteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> router_pb2.RouteResponse:
        self.routes += 1
        resp = router_pb2.RouteResponse(decision_id=f"d{self.routes}", explanation="only one")
        resp.candidates.add(worker_id="w1", region="kr", address="127.0.0.1:1", score=1.0)
        return resp

    async def ReportOutcomes(
        self, request: router_pb2.OutcomeBatch, context: grpc.aio.ServicerContext[Any, Any]
    ) -> router_pb2.OutcomeAck:
        self.outcomes.extend(r.decision_id for r in request.reports)
        return router_pb2.OutcomeAck()


async def test_a_router_without_route_stream_is_asked_with_unary_calls() -> None:
    servicer = _UnaryOnlyRouter()
    server = new_server()
    router_pb2_grpc.add_RouterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = RouterClient(f"127.0.0.1:{port}", outcome_flush_s=0.01)
    try:
        client.report_outcome(router_pb2.OutcomeReport(decision_id="earlier", worker_id="w1"))
        first = await client.route(router_pb2.RouteRequest(request_id="a", model="m"))
        second = await client.route(router_pb2.RouteRequest(request_id="b", model="m"))
        assert (first.decision_id, second.decision_id) == ("d1", "d2")
        client.report_outcome(router_pb2.OutcomeReport(decision_id="d1", worker_id="w1"))
        # The outcome taken for the refused stream message is not lost.
        await eventually(lambda: sorted(servicer.outcomes) == ["d1", "earlier"], timeout_s=2.0)
    finally:
        await client.close()
        await server.stop(None)
