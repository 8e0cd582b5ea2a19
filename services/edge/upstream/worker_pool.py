"""The edge's client for the workers (tokens): one gRPC channel per worker address, created on
first use and kept, so every request after the first to a worker reuses a warm HTTP/2
connection."""

from __future__ import annotations

import asyncio

import grpc

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common.grpcutil import insecure_channel

GenerateCall = grpc.aio.UnaryStreamCall[worker_pb2.GenerateRequest, worker_pb2.GenerateChunk]


class WorkerPool:
    """One channel per worker address, created on first use and kept."""

    def __init__(self) -> None:
        self._stubs: dict[str, tuple[grpc.aio.Channel, worker_pb2_grpc.WorkerStub]] = {}

    def _stub(self, address: str) -> worker_pb2_grpc.WorkerStub:
        entry = self._stubs.get(address)
        if entry is None:
            channel = insecure_channel(address)
            entry = (channel, worker_pb2_grpc.WorkerStub(channel))
            self._stubs[address] = entry
        return entry[1]

    async def embed(
        self,
        address: str,
        request: worker_pb2.EmbedRequest,
        *,
        timeout_s: float | None,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> worker_pb2.EmbedResponse:
        """One Embed call on the worker's warm channel (unary: nothing to stream)."""
        resp: worker_pb2.EmbedResponse = await self._stub(address).Embed(
            request, timeout=timeout_s, metadata=metadata or None
        )
        return resp

    def generate(
        self,
        address: str,
        request: worker_pb2.GenerateRequest,
        *,
        timeout_s: float | None,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> GenerateCall:
        entry = self._stubs.get(address)
        if entry is None:
            channel = insecure_channel(address)
            entry = (channel, worker_pb2_grpc.WorkerStub(channel))
            self._stubs[address] = entry
        call: GenerateCall = entry[1].Generate(
            request, timeout=timeout_s, metadata=metadata or None
        )
        return call

    async def close(self) -> None:
        stubs, self._stubs = self._stubs, {}
        await asyncio.gather(*(ch.close(grace=None) for ch, _ in stubs.values()))
