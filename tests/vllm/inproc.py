"""Meridian's full path in the test's event loop around the session's running vLLM engine.

``tests/support/inproc.start_worker`` starts (and later shuts down) the engine it serves; the
vLLM engine of this suite is started once per session (~20 s), so here the worker's gRPC
server is put in front of that engine without owning it: stopping the stack stops the server,
never the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import openai

from meridian.v1 import worker_pb2_grpc
from services.common.grpcutil import Health, new_server
from services.worker.service import WorkerService
from services.worker.vllm_engine import VllmEngine
from tests.support.inproc import RunningEdge, RunningRouter, start_edge, start_router


@dataclass
class ServedEngine:
    """A worker server in front of an engine it does not own."""

    service: WorkerService
    server: grpc.aio.Server
    address: str
    worker_id: str

    async def stop(self) -> None:
        await self.server.stop(0)


async def serve_engine(
    engine: VllmEngine, *, worker_id: str, region: str, report_interval_s: float = 0.05
) -> ServedEngine:
    """Serve an engine that is already READY (health SERVING from the start)."""
    service = WorkerService(
        engine=engine, worker_id=worker_id, region=region, report_interval_s=report_interval_s
    )
    server = new_server()
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    health = Health(["meridian.v1.Worker"])
    health.add_to(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await health.set_serving(True)
    return ServedEngine(service, server, f"127.0.0.1:{port}", worker_id)


@dataclass
class VllmStack:
    """Edge → router → one worker on the session's vLLM engine, and an OpenAI SDK client."""

    worker: ServedEngine
    router: RunningRouter
    edge: RunningEdge
    key: str
    client: openai.AsyncOpenAI

    async def stop(self) -> None:
        await self.client.close()
        await self.edge.stop()
        await self.router.stop()
        await self.worker.stop()


async def start_vllm_stack(engine: VllmEngine, *, redis_url: str) -> VllmStack:
    worker = await serve_engine(engine, worker_id="kr-vllm-1", region="kr")
    # Tolerant of stale reports: a busy vLLM CPU engine delays other wake-ups on a 2-core VM
    # by up to seconds, and these tests are about the path, not about failure detection.
    router = await start_router([worker.address], stale_after_s=5.0)
    await router.wait_healthy(1)
    edge = await start_edge(redis_url=redis_url, router_address=router.address)
    key = await edge.new_key("acme")
    client = openai.AsyncOpenAI(base_url=f"{edge.url}/v1", api_key=key, max_retries=0)
    return VllmStack(worker, router, edge, key, client)
