"""The edge's client for the router (decisions): ``RouterClient`` asks for a ranked list of
candidates and reports outcomes back without waiting for them (batched)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import grpc

from meridian.v1 import router_pb2, router_pb2_grpc
from services.common.errors import MeridianError, Unavailable, from_grpc
from services.common.grpcutil import insecure_channel
from services.common.logs import event
from services.common.tracecontext import inject_metadata

log = logging.getLogger("meridian.edge.upstream")


@dataclass(frozen=True, slots=True)
class RouteResult:
    decision_id: str
    candidates: tuple[router_pb2.Candidate, ...]
    explanation: str


class RouterUnreachable(Unavailable):
    """The router did not answer at all (connection refused, timeout): not a decision."""


class RouterLike(Protocol):
    """What the pipeline needs from a router: :class:`RouterClient`, or the edge's
    :class:`~services.edge.upstream.resilient_router.ResilientRouter` that falls back to the
    router's last view."""

    async def route(self, request: router_pb2.RouteRequest) -> RouteResult: ...

    async def list_models(self) -> router_pb2.ListModelsResponse: ...

    async def ready(self) -> bool: ...

    def report_outcome(self, report: router_pb2.OutcomeReport) -> None: ...


class RouterClient:
    """Route and ListModels/GetView calls; outcome reports are batched (see
    :meth:`report_outcome`)."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 2.0,
        outcome_flush_s: float = 0.02,
        max_outcome_batch: int = 512,
    ) -> None:
        self._channel = insecure_channel(address)
        self._stub = router_pb2_grpc.RouterStub(self._channel)
        self._timeout_s = timeout_s
        self._outcome_flush_s = outcome_flush_s
        self._max_outcome_batch = max_outcome_batch
        self._outcomes: list[router_pb2.OutcomeReport] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[None]] = set()

    async def route(self, request: router_pb2.RouteRequest) -> RouteResult:
        try:
            resp = await self._stub.Route(
                request, timeout=self._timeout_s, metadata=inject_metadata() or None
            )
        except grpc.aio.AioRpcError as err:
            raise _router_error(err) from None
        return RouteResult(
            decision_id=resp.decision_id,
            candidates=tuple(resp.candidates),
            explanation=resp.explanation,
        )

    async def list_models(self) -> router_pb2.ListModelsResponse:
        try:
            resp: router_pb2.ListModelsResponse = await self._stub.ListModels(
                router_pb2.ListModelsRequest(), timeout=self._timeout_s
            )
            return resp
        except grpc.aio.AioRpcError as err:
            raise _router_error(err) from None

    async def get_view(self) -> router_pb2.RouterView:
        try:
            view: router_pb2.RouterView = await self._stub.GetView(
                router_pb2.GetViewRequest(), timeout=self._timeout_s
            )
            return view
        except grpc.aio.AioRpcError as err:
            raise _router_error(err) from None

    async def watch_fleet(
        self, request: router_pb2.WatchFleetRequest
    ) -> AsyncIterator[router_pb2.FleetUpdate]:
        """The router's live feed for operators' consoles (services/edge/web/feed.py);
        cancelled with the iteration. Raises MeridianError when the router fails it."""
        call = self._stub.WatchFleet(request)
        try:
            async for update in call:
                yield update
        except grpc.aio.AioRpcError as err:
            raise _router_error(err) from None
        finally:
            call.cancel()

    async def explain_request(
        self, request: router_pb2.ExplainRequestQuery
    ) -> router_pb2.RequestExplanation:
        """The router's decisions for one request, explained (the chat page's "why")."""
        try:
            resp: router_pb2.RequestExplanation = await self._stub.ExplainRequest(
                request, timeout=self._timeout_s
            )
            return resp
        except grpc.aio.AioRpcError as err:
            raise _router_error(err) from None

    async def ready(self) -> bool:
        try:
            models = await self._stub.ListModels(router_pb2.ListModelsRequest(), timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        return len(models.models) > 0

    def report_outcome(self, report: router_pb2.OutcomeReport) -> None:
        """Fire and forget, batched: reports wait at most ``outcome_flush_s`` and leave in one
        ``ReportOutcomes`` call, so a busy edge makes one RPC per interval, not per request.
        The client's response never waits on the router."""
        self._outcomes.append(report)
        if len(self._outcomes) >= self._max_outcome_batch:
            self._flush()
        elif self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_later(self._outcome_flush_s, self._flush)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self._outcomes:
            return
        batch = router_pb2.OutcomeBatch(reports=self._outcomes)
        self._outcomes = []

        async def send() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._stub.ReportOutcomes(batch, timeout=self._timeout_s)

        task = asyncio.create_task(send())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        self._flush()
        if self._background:
            await asyncio.wait(self._background, timeout=1.0)
        await self._channel.close(grace=None)


def _router_error(err: grpc.aio.AioRpcError) -> MeridianError:
    code = err.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and not (
        err.trailing_metadata()
    ):
        event(log, "router.unreachable", level=logging.DEBUG, code=code.name)
        return RouterUnreachable("the router is unreachable; try again shortly", retry_after_s=1.0)
    return from_grpc(code, err.details(), err.trailing_metadata())
