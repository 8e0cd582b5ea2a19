"""A real vLLM worker process (``python -m services.worker --engine vllm``) behind a router and
an edge: it gets no traffic while its model loads, and none once SIGTERM has it draining, while
the requests it already has run to their end.

The worker is started once for the module (engine start ~20 s) and the tests run in order:
loading → ready → drain → exit. "No traffic" is checked where it matters: the router refuses to
route to the worker (its view says LOADING / draining), the edge answers 503, and the worker's
own log never mentions the refused request.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import openai
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2

from meridian.v1 import router_pb2, worker_pb2, worker_pb2_grpc
from services.common.clock import SYSTEM_CLOCK
from services.common.errors import Unavailable
from services.common.grpcutil import CHANNEL_OPTIONS, insecure_channel
from services.edge.upstream.router_client import RouterClient
from services.edge.upstream.worker_pool import GenerateCall
from services.router.scheduling.types import ModelState, WorkerSnapshot
from tests.support.inproc import RunningEdge, RunningRouter, start_edge, start_router
from tests.support.redis_proc import RedisProcess
from tests.support.stackproc import alive
from tests.support.wait import eventually
from tests.vllm.procs import WorkerProcess, descendants, start_vllm_worker

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

MODEL = "tiny-llama-proc"
WORKER_ID = "kr-vllm-1"
# Long responses (512-token context: the tiny model's positions) for the requests in flight
# during the drain; see the drain test for why they must be long.
CONTEXT = 512
STREAM_TOKENS = 480
IN_FLIGHT = 3


@pytest.fixture(scope="module")
def worker(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    proc = start_vllm_worker(
        model_dir=tiny_model_dir,
        served_name=MODEL,
        workdir=tmp_path_factory.mktemp("worker-proc"),
        extra=[
            "--max-model-len",
            str(CONTEXT),
            "--drain-grace-s",
            "60",
            "--engine-metrics",
            "--metrics-port",
            "0",
        ],
    )
    yield proc
    proc.stop()


@dataclass
class Site:
    router: RunningRouter
    edge: RunningEdge
    client: openai.AsyncOpenAI
    routes: RouterClient


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def site(worker: WorkerProcess, redis_process: RedisProcess) -> AsyncIterator[Site]:
    # A busy vLLM CPU engine delays every other process's wake-ups on a 2-core VM by up to
    # seconds; a router that declared the worker down for that would refuse it as "unhealthy"
    # rather than for the reasons checked here.
    router = await start_router([worker.address], stale_after_s=5.0)
    edge = await start_edge(redis_url=redis_process.url, router_address=router.address)
    key = await edge.new_key("acme")
    client = openai.AsyncOpenAI(base_url=f"{edge.url}/v1", api_key=key, max_retries=0)
    routes = RouterClient(router.address)
    yield Site(router, edge, client, routes)
    await routes.close()
    await client.close()
    await edge.stop()
    await router.stop()


def view(site: Site) -> WorkerSnapshot | None:
    """The router's current view of the worker (None before its first load report)."""
    for snap in site.router.fleet.snapshots(SYSTEM_CLOCK.monotonic()):
        if snap.worker_id == WORKER_ID:
            return snap
    return None


def model_state(site: Site) -> ModelState | None:
    snap = view(site)
    status = snap.model(MODEL) if snap is not None else None
    return status.state if status is not None else None


async def health(worker: WorkerProcess) -> int:
    async with insecure_channel(worker.address) as channel:
        # The standard health service's Check, bound as health_pb2_grpc.HealthStub binds it:
        # the grpc-health stubs declare no methods on HealthStub, so it is typed here.
        check: grpc.aio.UnaryUnaryMultiCallable[
            health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
        ] = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        reply = await check(health_pb2.HealthCheckRequest(service="meridian.v1.Worker"))
    return int(reply.status)


async def direct_generate(worker: WorkerProcess) -> grpc.aio.AioRpcError:
    """A request sent to the worker itself, past the router: the error it answers with."""
    request = worker_pb2.GenerateRequest(request_id=f"direct-{uuid.uuid4().hex}", model=MODEL)
    request.messages.add(role="user", content="Hello")
    async with insecure_channel(worker.address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).Generate(request)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
    return raised.value


async def refused_at_the_edge(site: Site, worker: WorkerProcess) -> str:
    """A chat request the edge answers with 503; returns the router's reason. The worker must
    not have seen it (its log never names the request)."""
    with pytest.raises(openai.InternalServerError) as raised:
        await site.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
        )
    assert raised.value.status_code == 503
    request_id = raised.value.response.headers["x-request-id"]
    assert request_id not in worker.log_text()
    with pytest.raises(Unavailable) as route:
        await site.routes.route(
            router_pb2.RouteRequest(
                request_id=request_id, model=MODEL, priority=router_pb2.PRIORITY_STANDARD
            )
        )
    return route.value.message


async def test_a_loading_worker_is_watched_but_gets_no_traffic_until_its_model_is_ready(
    site: Site, worker: WorkerProcess
) -> None:
    # The worker listens before its engine loads (~20 s here); the router connects at once.
    await eventually(lambda: model_state(site) is not None, timeout_s=30)
    snap = view(site)
    assert snap is not None
    assert snap.healthy
    assert model_state(site) is ModelState.LOADING  # ...but not servable
    assert await health(worker) == health_pb2.HealthCheckResponse.NOT_SERVING
    reason = await refused_at_the_edge(site, worker)
    assert f"model '{MODEL}' is loading" in reason
    refused = await direct_generate(worker)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert "loading" in (refused.details() or "")

    await eventually(lambda: model_state(site) is ModelState.READY, timeout_s=180)

    assert await health(worker) == health_pb2.HealthCheckResponse.SERVING
    raw = await site.client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
    )
    assert raw.headers["x-meridian-worker"] == WORKER_ID
    done = raw.parse()
    assert done.usage is not None
    assert done.usage.completion_tokens == 4
    await eventually(lambda: done.id in worker.log_text(), timeout_s=30)  # logged at the end


async def test_engine_metrics_puts_vllms_own_series_on_the_workers_metrics(
    site: Site, worker: WorkerProcess
) -> None:
    # --engine-metrics (off by default): vLLM's vllm:* families beside Meridian's, each
    # family once (the global registry's process collectors would repeat Meridian's).
    await eventually(lambda: model_state(site) is ModelState.READY, timeout_s=180)
    await site.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=3
    )
    assert worker.metrics_port is not None
    url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        text = await response.text()
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(families) == len(set(families)), "a family is exposed twice"
    assert "vllm:num_requests_running" in families
    generated = [
        line
        for line in text.splitlines()
        if line.startswith("vllm:generation_tokens_total{") and f'model_name="{MODEL}"' in line
    ]
    assert generated
    assert float(generated[0].split()[-1]) >= 3
    assert any(name.startswith("gen_ai_") or name.startswith("meridian_") for name in families)


async def test_sigterm_drains_no_new_traffic_and_in_flight_requests_run_to_their_end(
    site: Site, worker: WorkerProcess
) -> None:
    await eventually(lambda: model_state(site) is ModelState.READY, timeout_s=180)
    # Sent straight to the worker on a connection of their own (channels with equal options
    # share one: gRPC's global subchannel pool). Each response (480 tokens with 20 top
    # logprobs) is larger than an HTTP/2 flow-control window that does not grow (no BDP
    # probing), so the worker cannot finish them before this test reads them: they stay in
    # flight for as long as the checks below take, however slowly this host runs them.
    private = [
        *CHANNEL_OPTIONS,
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.http2.bdp_probe", 0),
    ]
    async with grpc.aio.insecure_channel(worker.address, options=private) as channel:
        calls = [long_generate(channel) for _ in range(IN_FLIGHT)]
        firsts = [await call.read() for call in calls]
        assert all(isinstance(first, worker_pb2.GenerateChunk) for first in firsts)
        engine_processes = descendants(worker.proc.pid)
        assert engine_processes, "a vLLM worker runs its engine core in a child process"

        os.kill(worker.proc.pid, signal.SIGTERM)

        await eventually(lambda: (s := view(site)) is not None and s.draining, timeout_s=30)
        assert model_state(site) is ModelState.DRAINING
        reason = await refused_at_the_edge(site, worker)
        assert "draining" in reason
        refused = await direct_generate(worker)
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
        assert "draining" in (refused.details() or "")
        assert worker.proc.poll() is None  # still draining: the requests are in flight

        results = [await outcome(call) for call in calls]

    assert results == [("length", STREAM_TOKENS)] * IN_FLIGHT
    assert await asyncio.to_thread(worker.proc.wait, 60) == 0
    await eventually(lambda: not any(alive(pid) for pid in engine_processes), timeout_s=30)
    log = worker.log_text()
    assert f'"event":"worker.draining","inflight":{IN_FLIGHT},' in log
    assert '"event":"worker.stopped","aborted":0' in log


def long_generate(channel: grpc.aio.Channel) -> GenerateCall:
    request = worker_pb2.GenerateRequest(
        request_id=f"long-{uuid.uuid4().hex}",
        model=MODEL,
        sampling=worker_pb2.SamplingParams(
            max_tokens=STREAM_TOKENS, ignore_eos=True, logprobs=True, top_logprobs=20
        ),
    )
    request.messages.add(role="user", content="Tell me a long story.")
    call: GenerateCall = worker_pb2_grpc.WorkerStub(channel).Generate(request)
    return call


async def outcome(call: GenerateCall) -> tuple[str | None, int]:
    """Read the rest of a call (``read()``: gRPC does not allow iterating after it)."""
    last = worker_pb2.GenerateChunk()
    while isinstance(chunk := await call.read(), worker_pb2.GenerateChunk):
        last = chunk
    return FINISH[last.finish_reason], last.usage.completion_tokens


FINISH = {
    worker_pb2.FINISH_REASON_STOP: "stop",
    worker_pb2.FINISH_REASON_LENGTH: "length",
    worker_pb2.FINISH_REASON_ABORT: "abort",
}
