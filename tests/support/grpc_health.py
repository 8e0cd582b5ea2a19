"""The standard gRPC health service's ``Check``, typed (the grpc-health stubs declare no
methods on ``HealthStub``)."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2

from services.common.grpcutil import insecure_channel

HealthCheck = grpc.aio.UnaryUnaryMultiCallable[
    health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health_check(channel: grpc.aio.Channel) -> HealthCheck:
    return channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )


async def health_of(address: str, service: str = "", timeout_s: float = 2.0) -> int:
    """The status ``address`` reports for ``service`` ("" = the server as a whole)."""
    async with insecure_channel(address) as channel:
        reply = await health_check(channel)(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
        )
        return int(reply.status)
