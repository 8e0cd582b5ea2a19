"""gRPC plumbing every service shares: server and channel options, health checking, and the
mapping of :mod:`services.common.errors` onto gRPC status.

Keepalive is tuned so a dead peer (a killed worker, a cut network) is noticed within about a
second on idle connections, which is what lets the router mark a worker down quickly.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.errors import MeridianError
from services.common.grpc_tls import GrpcTls

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
    return grpc.aio.server(options=list(SERVER_OPTIONS), interceptors=[RefuseUndecodable()])


class Undecodable:
    """What a message that does not parse as its type becomes (see :class:`RefuseUndecodable`):
    a streaming handler that reads one ends its call with INVALID_ARGUMENT and ``why``."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


class RefuseUndecodable(grpc.aio.ServerInterceptor):
    """Bytes that are not the method's request message (garbage, a truncated message, bad
    UTF-8 in a string, a Struct nested past protobuf's depth limit) are INVALID_ARGUMENT
    saying why, on every RPC. By default grpcio answers UNKNOWN and logs an error with a
    traceback per message — a log flood anyone who reaches the port can cause.

    The deserializer turns a parse failure into an :class:`Undecodable`; a unary request is
    refused before the handler runs; a streaming handler checks what it reads."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[object, grpc.RpcMethodHandler[Any, Any] | None]] = {}

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        cached = self._wrapped.get(handler_call_details.method)
        if cached is not None and cached[0] is handler:  # the same servicer method: reuse
            return cached[1]
        wrapped = self._wrap(handler)
        self._wrapped[handler_call_details.method] = (handler, wrapped)
        return wrapped

    @staticmethod
    def _wrap(
        handler: grpc.RpcMethodHandler[Any, Any] | None,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        decode = getattr(handler, "request_deserializer", None)
        if handler is None or decode is None:
            return handler

        def tolerant(data: bytes) -> object:
            try:
                return decode(data)
            except Exception as err:  # noqa: BLE001  # DecodeError, and upb's depth/UTF-8 errors
                return Undecodable(f"the request is not a valid message: {err}")

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _refusing_unary(handler.unary_unary), tolerant, handler.response_serializer
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _refusing_unary_stream(handler.unary_stream), tolerant, handler.response_serializer
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                handler.stream_unary, tolerant, handler.response_serializer
            )
        return grpc.stream_stream_rpc_method_handler(
            cast(Any, handler.stream_stream), tolerant, handler.response_serializer
        )


def _refusing_unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def call(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.why)
        return await behavior(request, context)

    return call


def _refusing_unary_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    """grpc.aio runs a handler by its kind (an async generator function is iterated, a
    coroutine function awaited), so the wrapper is of the handler's kind. Generate's chunks
    pass through one more ``async for`` here: the edge's default transport is GenerateMux, a
    bidi stream, which this adds nothing to."""
    if not inspect.isasyncgenfunction(behavior):
        return _refusing_unary(behavior)  # a coroutine that writes with context.write

    async def stream(
        request: object, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.why)
        async for item in behavior(request, context):
            yield item

    return stream


def insecure_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=list(CHANNEL_OPTIONS))


def channel_to(address: str, tls: GrpcTls | None) -> grpc.aio.Channel:
    """A channel to another Meridian service: mutual TLS when the deployment has it
    (:mod:`services.common.grpc_tls`), plaintext otherwise."""
    if tls is None:
        return insecure_channel(address)
    return grpc.aio.secure_channel(
        address,
        tls.channel_credentials(),
        options=[*CHANNEL_OPTIONS, *tls.channel_options()],
    )


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
