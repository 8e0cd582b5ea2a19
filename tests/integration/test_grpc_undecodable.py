"""Bytes that are not the method's request message are INVALID_ARGUMENT saying so, on every
RPC of both services, with no error logged: grpcio's default is UNKNOWN and an error-level
traceback per message, which anyone who reaches a port could use to flood the logs."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from meridian.v1 import router_pb2, worker_pb2
from services.common.grpcutil import insecure_channel
from services.worker.sim import SimConfig, SimEngine
from tests.support.inproc import start_router, start_worker

GARBAGE = b"\xff\xff\xff\xff"
TRUNCATED = router_pb2.RouteRequest(model="m" * 40).SerializeToString()[:-5]
BAD_UTF8 = b"\x12\x02\xc3\x28"  # field 2 (model), two bytes that are not UTF-8

UNARY = [
    ("/meridian.v1.Router/Route", GARBAGE),
    ("/meridian.v1.Router/Route", TRUNCATED),
    ("/meridian.v1.Router/Route", BAD_UTF8),
    ("/meridian.v1.Router/ReportOutcomes", GARBAGE),
    ("/meridian.v1.Router/ListModels", GARBAGE),
    ("/meridian.v1.Worker/Probe", GARBAGE),
    ("/meridian.v1.Worker/Describe", GARBAGE),
    ("/meridian.v1.Worker/Embed", GARBAGE),
]
SERVER_STREAMING = [
    ("/meridian.v1.Worker/Generate", GARBAGE),
    ("/meridian.v1.Worker/WatchLoad", GARBAGE),
    ("/meridian.v1.Router/WatchFleet", GARBAGE),
]


@pytest.fixture
async def addresses() -> AsyncIterator[dict[str, str]]:
    worker = await start_worker(SimEngine(SimConfig()), worker_id="w1", region="kr")
    router = await start_router([worker.address])
    await router.wait_healthy(1)
    yield {"Router": router.address, "Worker": worker.address}
    await router.stop()
    await worker.stop()


def _raw(method: str) -> tuple[str, str]:
    service = method.split("/")[1].rsplit(".", 1)[1]
    return service, method


async def _finish(call: object) -> None:
    if hasattr(call, "__aiter__"):
        async for _ in call:
            pass
    else:
        await call  # type: ignore[misc]


async def _expect_invalid(call: object) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _finish(call)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert "the request is not a valid message" in (err.value.details() or "")


@pytest.mark.parametrize(("method", "payload"), UNARY + SERVER_STREAMING)
async def test_an_undecodable_request_is_invalid_argument_and_logs_no_error(
    addresses: dict[str, str], method: str, payload: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    service, path = _raw(method)
    channel = insecure_channel(addresses[service])
    try:
        identity = lambda b: b  # noqa: E731  # send the bytes as they are
        with caplog.at_level(logging.WARNING):
            if (method, payload) in SERVER_STREAMING:
                stream: Any = channel.unary_stream(path, request_serializer=identity)
                await _expect_invalid(stream(payload, timeout=3.0))
            else:
                unary: Any = channel.unary_unary(path, request_serializer=identity)
                await _expect_invalid(unary(payload, timeout=3.0))
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        await channel.close()


@pytest.mark.parametrize(
    "method", ["/meridian.v1.Router/RouteStream", "/meridian.v1.Worker/GenerateMux"]
)
async def test_an_undecodable_message_on_a_bidi_stream_ends_the_call_as_invalid_argument(
    addresses: dict[str, str], method: str, caplog: pytest.LogCaptureFixture
) -> None:
    service, path = _raw(method)
    channel = insecure_channel(addresses[service])
    try:
        bidi: Any = channel.stream_stream(path, request_serializer=lambda b: b)

        async def messages() -> AsyncIterator[bytes]:
            yield GARBAGE

        with caplog.at_level(logging.WARNING):
            await _expect_invalid(bidi(messages(), timeout=3.0))
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        # The server is unharmed: a well-formed call right after is answered.
        probe: Any = channel.unary_unary(
            "/meridian.v1.Router/ListModels"
            if service == "Router"
            else "/meridian.v1.Worker/Probe",
            request_serializer=lambda m: m.SerializeToString(),
        )
        request = (
            router_pb2.ListModelsRequest() if service == "Router" else worker_pb2.ProbeRequest()
        )
        await probe(request, timeout=3.0)
    finally:
        await channel.close()
