"""gRPC plumbing every service shares: server and channel options, health checking, and the
mapping of :mod:`services.common.errors` onto gRPC status.

Keepalive is tuned so a dead peer (a killed worker, a cut network) is noticed within about a
second on idle connections, which is what lets the router mark a worker down quickly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.errors import MeridianError

MAX_MESSAGE_BYTES = 4 * 1024 * 1024

SERVER_OPTIONS: Sequence[tuple[str, int]] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.so_reuseport", 0),
)

CHANNEL_OPTIONS: Sequence[tuple[str, int]] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 1_000),
    ("grpc.keepalive_timeout_ms", 1_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect fast after a worker restarts instead of backing off for minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    # Despite its name, gRPC core uses this as the *minimum connect timeout*: the time one
    # connection attempt gets to finish TCP and the HTTP/2 settings exchange. At 200 ms, a
    # region more than ~130 ms of RTT away never connected (and a loaded host flaked).
    ("grpc.min_reconnect_backoff_ms", 5_000),
    ("grpc.enable_retries", 0),
)


def new_server() -> grpc.aio.Server:
    return grpc.aio.server(options=list(SERVER_OPTIONS))


def insecure_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=list(CHANNEL_OPTIONS))


class Health:
    """Standard ``grpc.health.v1`` service. The overall status ("") and named services move
    together: SERVING when ready, NOT_SERVING while loading or draining."""

    def __init__(self, services: Sequence[str]) -> None:
        self.servicer = health.aio.HealthServicer()
        self._services = ["", *services]

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self._services:
            await self.servicer.set(name, status)

    async def shutdown(self) -> None:
        await self.servicer.enter_graceful_shutdown()


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], err: MeridianError) -> None:
    """End an RPC with the gRPC status (and trailers) that ``err`` maps to. Never returns."""
    context.set_trailing_metadata(err.grpc_trailers())
    await context.abort(err.grpc_code, err.message)
