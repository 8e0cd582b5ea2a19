"""The edge's outcome reports reach the router in batches and free in-flight slots at once."""

from __future__ import annotations

from meridian.v1 import router_pb2
from services.common.clock import SYSTEM_CLOCK
from services.edge.upstream.router_client import RouterClient
from services.worker.sim import SimConfig, SimEngine
from tests.support.inproc import start_router, start_worker
from tests.support.wait import eventually


async def test_batched_outcomes_release_in_flight_before_any_load_report() -> None:
    worker = await start_worker(SimEngine(SimConfig()), worker_id="w1", region="kr")
    # Load reports every 10 s: only outcome reports can clear the assignments in time.
    router = await start_router([worker.address], report_interval_ms=10_000)
    client = RouterClient(router.address, outcome_flush_s=0.01)
    try:
        await router.wait_healthy(1)
        decisions = [
            await client.route(router_pb2.RouteRequest(request_id=f"r{i}", model="meridian-sim"))
            for i in range(5)
        ]

        def in_flight() -> int:
            (snap,) = router.fleet.snapshots(SYSTEM_CLOCK.monotonic())
            return snap.in_flight

        assert in_flight() == 5
        for d in decisions:
            client.report_outcome(
                router_pb2.OutcomeReport(
                    decision_id=d.decision_id,
                    worker_id=d.candidates[0].worker_id,
                    outcome=router_pb2.OUTCOME_SUCCESS,
                )
            )
        await eventually(lambda: in_flight() == 0, timeout_s=2.0)
    finally:
        await client.close()
        await router.stop()
        await worker.stop()


async def test_closing_the_client_flushes_pending_outcomes() -> None:
    worker = await start_worker(SimEngine(SimConfig()), worker_id="w1", region="kr")
    router = await start_router([worker.address], report_interval_ms=10_000)
    client = RouterClient(router.address, outcome_flush_s=60.0)  # never by the timer
    try:
        await router.wait_healthy(1)
        d = await client.route(router_pb2.RouteRequest(request_id="r", model="meridian-sim"))
        client.report_outcome(
            router_pb2.OutcomeReport(
                decision_id=d.decision_id,
                worker_id=d.candidates[0].worker_id,
                outcome=router_pb2.OUTCOME_FAILED,
            )
        )
        await client.close()
        (snap,) = router.fleet.snapshots(SYSTEM_CLOCK.monotonic())
        assert snap.in_flight == 0
        assert snap.recent_failures == 1
    finally:
        await router.stop()
        await worker.stop()
