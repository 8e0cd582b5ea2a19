"""A real gRPC call (the standard health service, grpc.aio) through a DelayProxy: HTTP/2 over
the emulated link works, shows the added latency, fails over a cut and heals after it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2

from services.common.grpcutil import Health, insecure_channel, new_server
from services.netem.config import LinkProfile, Route
from services.netem.proxy import CutMode, DelayProxy

DELAY_S = 0.05
SERVING = health_pb2.HealthCheckResponse.SERVING

HealthCheck = grpc.aio.UnaryUnaryMultiCallable[
    health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
]


def health_check(channel: grpc.aio.Channel) -> HealthCheck:
    """The standard health service's ``Check``, as ``health_pb2_grpc.HealthStub`` binds it:
    the grpc-health stubs declare no methods on ``HealthStub``, so this one is typed here."""
    return channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )


@pytest.fixture
async def grpc_port() -> AsyncIterator[int]:
    server = new_server()
    health = Health(["meridian.v1.Worker"])
    health.add_to(server)
    port: int = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await health.set_serving(True)
    yield port
    await server.stop(None)


@pytest.fixture
async def proxy(grpc_port: int) -> AsyncIterator[DelayProxy]:
    route = Route(
        name="grpc",
        upstream_host="127.0.0.1",
        upstream_port=grpc_port,
        link=LinkProfile(delay_ms=DELAY_S * 1000),
    )
    async with DelayProxy(route) as p:
        yield p


async def timed_check(check: HealthCheck) -> tuple[int, float]:
    start = time.monotonic()
    reply = await check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    return reply.status, time.monotonic() - start


async def test_a_grpc_call_through_the_proxy_sees_the_added_round_trip(proxy: DelayProxy) -> None:
    async with insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
        check = health_check(channel)
        await timed_check(check)  # connection setup and HTTP/2 settings exchange
        results = [await timed_check(check) for _ in range(3)]
    assert all(status == SERVING for status, _ in results)
    fastest = min(elapsed for _, elapsed in results)
    assert fastest >= 2 * DELAY_S
    assert fastest < 2 * DELAY_S + 1.0
    assert proxy.stats().connections_total == 1


async def test_a_grpc_call_fails_over_a_refuse_cut_and_succeeds_after_restore(
    proxy: DelayProxy,
) -> None:
    async with insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
        check = health_check(channel)
        assert (await timed_check(check))[0] == SERVING
        proxy.cut(CutMode.REFUSE)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        assert caught.value.code() in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )
        proxy.restore()
        reply = await check(
            health_pb2.HealthCheckRequest(service=""), timeout=10, wait_for_ready=True
        )
    assert reply.status == SERVING
    # The cut reset the first connection; the channel had to open a second one after restore.
    assert proxy.stats().connections_total == 2


async def test_a_channel_connects_to_a_region_a_quarter_second_away(grpc_port: int) -> None:
    """Our channels reconnect fast (200 ms backoff) but give one connection attempt far longer
    than that: the server's HTTP/2 settings arrive only after the link's one-way delay, and a
    channel that gave up at 200 ms could never reach a region across an ocean."""
    route = Route(
        name="far",
        upstream_host="127.0.0.1",
        upstream_port=grpc_port,
        link=LinkProfile(delay_ms=250),
    )
    async with (
        DelayProxy(route) as far,
        insecure_channel(f"127.0.0.1:{far.port}") as channel,
    ):
        status, elapsed = await timed_check(health_check(channel))
    assert status == SERVING
    assert elapsed >= 0.5  # connection set-up and the call both crossed the link
