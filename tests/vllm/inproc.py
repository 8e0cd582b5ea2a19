"""Meridian's full path in the test's event loop around the session's running vLLM engine.

``tests/support/inproc.start_worker`` starts (and later shuts down) the engine it serves; the
vLLM engine of this suite is started once per session (~20 s), so here the production
``WorkerServer`` is put in front of that engine with ``owns_engine=False``: stopping the stack
stops the server, never the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import openai

from services.worker.server import WorkerConfig, WorkerServer
from services.worker.vllm.engine import VllmEngine
from tests.support.inproc import RunningEdge, RunningRouter, start_edge, start_router


async def serve_engine(
    engine: VllmEngine, *, worker_id: str, region: str, report_interval_s: float = 0.05
) -> WorkerServer:
    """The production worker server in front of an engine that is already READY and that it
    does not own (``owns_engine=False``): stopping it never stops the engine."""
    server = WorkerServer(
        config=WorkerConfig(
            worker_id=worker_id,
            region=region,
            report_interval_s=report_interval_s,
            drain_grace_s=1.0,
            stop_grace_s=0.0,
        ),
        engine=engine,
        owns_engine=False,
    )
    await server.start()
    await server.wait_loaded()
    return server


@dataclass
class VllmStack:
    """Edge → router → one worker on the session's vLLM engine, and an OpenAI SDK client."""

    worker: WorkerServer
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
