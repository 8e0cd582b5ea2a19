"""Mutual TLS between the services: a whole request over it, and every caller without the
deployment's certificate refused at the handshake (real gRPC servers on 127.0.0.1, certificates
from the development CA written for each test)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest

from meridian.v1 import router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.common.devca import write_dev_ca
from services.common.grpc_tls import GrpcTls
from services.common.grpcutil import channel_to, insecure_channel
from services.worker.sim import SimEngine
from tests.integration.conftest import MODEL, sim_config
from tests.support.builders import edge_config
from tests.support.inproc import (
    RunningEdge,
    RunningRouter,
    RunningWorker,
    start_edge,
    start_router,
    start_worker,
    stop_all,
)


def tls_from(folder: Path, name: str = "service") -> GrpcTls:
    files = write_dev_ca(folder, names=(name,))[name]
    return GrpcTls.from_files(cert=files.cert, key=files.key, ca=files.ca)


@dataclass
class SecureStack:
    worker: RunningWorker
    router: RunningRouter
    edge: RunningEdge
    tls: GrpcTls
    key: str


@pytest.fixture
async def secure(redis_url: str, tmp_path: Path) -> AsyncIterator[SecureStack]:
    tls = tls_from(tmp_path / "ca")
    worker = await start_worker(SimEngine(sim_config()), worker_id="kr-1", region="kr", tls=tls)
    router = await start_router([worker.address], tls=tls)
    await router.wait_healthy(1)  # the router watches the worker over mutual TLS
    edge = await start_edge(
        redis_url=redis_url, router_address=router.address, config=edge_config(grpc_tls=tls)
    )
    key = await edge.new_key()
    yield SecureStack(worker, router, edge, tls, key)
    await stop_all(edge, router, worker)


async def test_a_streamed_chat_goes_edge_router_worker_over_mutual_tls(
    secure: SecureStack,
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{secure.edge.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {secure.key}"},
            json=body,
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        events = [
            line.removeprefix("data: ")
            for line in (await resp.text()).splitlines()
            if line.startswith("data: ")
        ]
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 5


async def test_a_plaintext_caller_is_refused_by_the_worker_and_the_router(
    secure: SecureStack,
) -> None:
    async with insecure_channel(secure.worker.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await worker_pb2_grpc.WorkerStub(channel).Describe(
                worker_pb2.DescribeRequest(), timeout=2
            )
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    async with insecure_channel(secure.router.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await router_pb2_grpc.RouterStub(channel).ListModels(
                router_pb2.ListModelsRequest(), timeout=2
            )
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_a_caller_without_a_client_certificate_is_refused(secure: SecureStack) -> None:
    """It trusts the worker's CA (so it can check the worker) but presents nothing."""
    credentials = grpc.ssl_channel_credentials(root_certificates=secure.tls.ca)
    async with grpc.aio.secure_channel(secure.worker.address, credentials) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await worker_pb2_grpc.WorkerStub(channel).Describe(
                worker_pb2.DescribeRequest(), timeout=2
            )
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_a_caller_whose_certificate_another_ca_signed_is_refused(
    secure: SecureStack, tmp_path: Path
) -> None:
    stranger = tls_from(tmp_path / "other-ca", "stranger")
    # It trusts the right CA, so only its own certificate can be the reason.
    mixed = GrpcTls(stranger.cert_chain, stranger.private_key, secure.tls.ca)
    async with channel_to(secure.worker.address, mixed) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await worker_pb2_grpc.WorkerStub(channel).Describe(
                worker_pb2.DescribeRequest(), timeout=2
            )
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    async with channel_to(secure.worker.address, secure.tls) as channel:  # the control
        info = await worker_pb2_grpc.WorkerStub(channel).Describe(
            worker_pb2.DescribeRequest(), timeout=2
        )
    assert info.worker_id == "kr-1"


async def test_a_router_with_another_ca_never_sees_the_worker(
    secure: SecureStack, tmp_path: Path
) -> None:
    """A caller that cannot check the worker's certificate does not talk to it."""
    router = await start_router([secure.worker.address], tls=tls_from(tmp_path / "other"))
    try:
        with pytest.raises(TimeoutError):
            await router.wait_healthy(1, timeout_s=1.5)
        assert router.fleet.snapshots(time.monotonic()) == []  # it never described itself
    finally:
        await router.stop()


async def test_the_container_health_check_speaks_mutual_tls(
    secure: SecureStack, tmp_path: Path
) -> None:
    files = write_dev_ca(tmp_path / "hc", names=("hc",))["hc"]  # another CA: refused
    good = secure.worker.server.config.tls
    assert good is not None
    folder = tmp_path / "good"
    folder.mkdir()
    (folder / "c.crt").write_bytes(good.cert_chain)
    (folder / "c.key").write_bytes(good.private_key)
    (folder / "ca.crt").write_bytes(good.ca)

    async def check(*flags: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.common.healthcheck",
            "grpc",
            secure.worker.address,
            *flags,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, err.decode()

    def tls_flags(cert: Path, key: Path, ca: Path) -> list[str]:
        return ["--grpc-tls-cert", str(cert), "--grpc-tls-key", str(key), "--grpc-tls-ca", str(ca)]

    assert await check(*tls_flags(folder / "c.crt", folder / "c.key", folder / "ca.crt")) == (0, "")
    code, err = await check()
    assert (code, err.strip()) == (1, f"unhealthy: {secure.worker.address}: UNAVAILABLE")
    code, _ = await check(*tls_flags(files.cert, files.key, files.ca))
    assert code == 1
    code, err = await check("--grpc-tls-cert", str(files.cert))
    assert code == 2
    assert "--grpc-tls-key, --grpc-tls-ca missing" in err


async def test_workers_dialled_by_an_address_no_certificate_lists_need_the_server_name(
    tmp_path: Path,
) -> None:
    """As on Kubernetes (deploy/k8s-grpc-mtls): pods are dialled by IP, the certificate names
    ``meridian.internal``; ``--grpc-tls-server-name`` makes callers expect that name."""
    files = write_dev_ca(tmp_path / "ca", names=("svc",), hosts=("meridian.internal",))["svc"]
    named = GrpcTls.from_files(
        cert=files.cert, key=files.key, ca=files.ca, server_name="meridian.internal"
    )
    worker = await start_worker(SimEngine(sim_config()), worker_id="kr-1", region="kr", tls=named)
    try:
        async with channel_to(worker.address, named) as channel:
            info = await worker_pb2_grpc.WorkerStub(channel).Describe(
                worker_pb2.DescribeRequest(), timeout=2
            )
        assert info.worker_id == "kr-1"
        plain_name = GrpcTls(named.cert_chain, named.private_key, named.ca)  # expects 127.0.0.1
        async with channel_to(worker.address, plain_name) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await worker_pb2_grpc.WorkerStub(channel).Describe(
                    worker_pb2.DescribeRequest(), timeout=2
                )
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        await worker.stop()
