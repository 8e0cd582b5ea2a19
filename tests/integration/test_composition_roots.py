"""The tests run the production wiring: the in-loop router and worker are the same
``RouterServer`` / ``WorkerServer`` that ``python -m services.router`` / ``services.worker``
build, so they answer standard health checks and keep the production start/stop order."""

from __future__ import annotations

import asyncio

import pytest

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common.grpcutil import insecure_channel
from services.router.server import RouterServer
from services.worker.server import WorkerConfig, WorkerServer
from services.worker.sim import SimConfig, SimEngine
from tests.support.grpc_health import NOT_SERVING, SERVING, health_of
from tests.support.inproc import start_router, start_worker
from tests.support.wait import eventually


def sim() -> SimEngine:
    return SimEngine(SimConfig.from_mapping({"models": ["m"], "time_scale": 0.05}))


async def test_the_test_router_answers_standard_health_checks() -> None:
    router = await start_router([])
    assert isinstance(router.server, RouterServer)
    assert await health_of(router.address) == SERVING
    assert await health_of(router.address, "meridian.v1.Router") == SERVING
    await router.stop()


async def test_the_test_worker_is_not_serving_while_it_drains_its_streams() -> None:
    worker = await start_worker(sim(), worker_id="w1", region="kr")
    assert isinstance(worker.server, WorkerServer)
    assert await health_of(worker.address, "meridian.v1.Worker") == SERVING
    req = worker_pb2.GenerateRequest(request_id="long-1", model="m")
    req.messages.add(role="user", content="hello")
    req.sampling.max_tokens = 4000
    req.sampling.ignore_eos = True
    async with insecure_channel(worker.address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).Generate(req)
        await call.read()  # streaming now
        stopping = asyncio.ensure_future(worker.stop())
        await eventually(lambda: worker.service.draining)
        assert not stopping.done()  # the drain waits for the stream (up to its grace)
        assert await health_of(worker.address, "meridian.v1.Worker") == NOT_SERVING
        await stopping
    assert worker.service.inflight == 0


async def test_a_worker_that_is_still_loading_is_not_serving() -> None:
    class SlowStart(SimEngine):
        def __init__(self) -> None:
            super().__init__(SimConfig.from_mapping({"models": ["m"]}))
            self.release = asyncio.Event()

        async def start(self) -> None:
            await self.release.wait()
            await super().start()

    engine = SlowStart()
    server = WorkerServer(config=WorkerConfig(worker_id="w2", region="kr"), engine=engine)
    await server.start()
    try:
        assert await health_of(server.address, "meridian.v1.Worker") == NOT_SERVING
        engine.release.set()
        await server.wait_loaded()
        assert await health_of(server.address, "meridian.v1.Worker") == SERVING
    finally:
        await server.stop()


@pytest.mark.parametrize("service", ["", "meridian.v1.Router"])
async def test_a_stopped_router_reports_not_serving_to_watchers_first(service: str) -> None:
    router = await start_router([])
    await router.server.health.shutdown()  # the first step of stop()
    assert await health_of(router.address, service) == NOT_SERVING
    await router.stop()
