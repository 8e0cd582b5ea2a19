"""The edge's client for the workers (tokens): one gRPC channel per worker address, created on
first use and kept, so every request after the first to a worker reuses a warm HTTP/2
connection.

Token streams go over one of two transports (``--worker-transport``): ``mux`` (the default),
every stream to a worker over one GenerateMux call, whose frames carry the output of all its
streams per engine step (services/edge/upstream/mux.py); ``call``, one Generate call per
stream (what older workers get). Callers get the same call object either way."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal, Protocol, get_args

import grpc

from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common.grpc_tls import GrpcTls
from services.common.grpcutil import channel_to
from services.edge.counters import EdgeCounters
from services.edge.upstream.mux import MuxSession

GenerateCall = grpc.aio.UnaryStreamCall[worker_pb2.GenerateRequest, worker_pb2.GenerateChunk]


class TokenCall(Protocol):
    """What the edge uses of a token stream, on either transport: chunks then
    ``grpc.aio.EOF`` from ``read`` (or an ``AioRpcError``), ``cancel``, ``done``."""

    async def read(self) -> Any: ...

    def cancel(self) -> bool: ...

    def done(self) -> bool: ...


WorkerTransport = Literal["call", "mux"]
#: How long a worker without GenerateMux is used over Generate before the pool asks again.
NO_MUX_RECHECK_S = 300.0
WORKER_TRANSPORTS: tuple[str, ...] = get_args(WorkerTransport)


class WorkerPool:
    """One channel per worker address, created on first use and kept; with the ``mux``
    transport, one GenerateMux call per worker on it too."""

    def __init__(
        self,
        transport: WorkerTransport = "mux",
        counters: EdgeCounters | None = None,
        *,
        tls: GrpcTls | None = None,
    ) -> None:
        if transport not in WORKER_TRANSPORTS:
            raise ValueError(f"transport must be one of {WORKER_TRANSPORTS}, got {transport!r}")
        self.transport = transport
        self._tls = tls
        self._counters = counters or EdgeCounters()
        self._stubs: dict[str, tuple[grpc.aio.Channel, worker_pb2_grpc.WorkerStub]] = {}
        self._sessions: dict[str, MuxSession] = {}
        #: Workers that have no GenerateMux, until when (monotonic): asked again after that.
        self._no_mux: dict[str, float] = {}
        self._closing: set[asyncio.Future[None]] = set()

    def _stub(self, address: str) -> worker_pb2_grpc.WorkerStub:
        entry = self._stubs.get(address)
        if entry is None:
            channel = channel_to(address, self._tls)
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
    ) -> TokenCall:
        """A token stream: a Generate call, or a stream on the worker's GenerateMux call
        (``timeout_s`` is then not applied: the edge's own watchdogs bound a stream)."""
        if self.transport == "mux" and self._no_mux.get(address, 0.0) < time.monotonic():
            session = self._session(address)
            if session is not None:
                return session.open(request, metadata)
        return self._generate_call(address, request, timeout_s, metadata)

    def _generate_call(
        self,
        address: str,
        request: worker_pb2.GenerateRequest,
        timeout_s: float | None,
        metadata: tuple[tuple[str, str], ...],
    ) -> GenerateCall:
        call: GenerateCall = self._stub(address).Generate(
            request, timeout=timeout_s, metadata=metadata or None
        )
        return call

    def _session(self, address: str) -> MuxSession | None:
        """The worker's open GenerateMux call; a new one if the last broke; None for a
        worker that has no GenerateMux."""
        session = self._sessions.get(address)
        if session is not None and session.closed:
            self._sessions.pop(address)
            closing = asyncio.ensure_future(session.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            if session.unsupported:
                self._no_mux[address] = time.monotonic() + NO_MUX_RECHECK_S
                return None
            session = None
        if session is None:
            session = self._sessions[address] = MuxSession(
                self._stub(address),
                address,
                fallback=lambda request, metadata: self._generate_call(
                    address, request, None, metadata
                ),
                counters=self._counters,
            )
        return session

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        await asyncio.gather(*(s.close() for s in sessions.values()), *self._closing)
        stubs, self._stubs = self._stubs, {}
        await asyncio.gather(*(ch.close(grace=None) for ch, _ in stubs.values()))
