"""Routing that survives the router: the edge keeps the router's last view and, while the
router is unreachable, ranks workers from it by a simple local rule.

Why a view and not the last answers: a cached ``RouteResponse`` per (model, regions) would
send every request of an outage to the same primary worker (a herd), and knows nothing about
workers it did not happen to rank. The view (``GetView``, refreshed every ``refresh_every_s``)
lists every worker with its health, models, region, RTT and load, so the local rule can spread
load and honour residency for any request.

The local rule (:func:`rank_locally`): keep workers that are healthy, not draining, serve the
model READY with what the request needs (the router's capability rule), are in an allowed region
and not excluded; order by load — (running + waiting + assigned) / max_running, in steps of 0.1
so near-equal loads tie — then by RTT, ties broken at random. Requests this edge sends while
falling back are added to the load of their worker until the next view arrives, so a burst does
not pile onto one worker.

The fallback is used only when the router did not answer (:class:`RouterUnreachable`); a
router that answers with an error (unknown model, no capacity) is obeyed. It is counted, and
it stops when the view is older than ``max_age_s``. Recovery needs nothing: the next request
asks the router first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meridian.v1 import router_pb2, worker_pb2
from services.common import capabilities
from services.common.clock import Clock
from services.common.errors import InvalidRequest, MeridianError
from services.common.logs import event
from services.edge.counters import EdgeCounters
from services.edge.upstream.router_client import RouterClient, RouteResult, RouterUnreachable

log = logging.getLogger("meridian.edge.routeview")


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewConfig:
    refresh_every_s: float = 2.0
    max_age_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.refresh_every_s <= self.max_age_s:
            raise ValueError("need 0 < refresh_every_s <= max_age_s")


def _serves(worker: router_pb2.WorkerView, model: str, needs: capabilities.Needs) -> bool:
    """The model is READY there and supports what the request needs (the router's own rule,
    ``services.common.capabilities.unmet``)."""
    return any(
        m.name == model
        and m.state == worker_pb2.MODEL_STATE_READY
        and capabilities.unmet(capabilities.Capabilities.from_pb(m), needs) is None
        for m in worker.load.models
    )


def rank_locally(
    view: router_pb2.RouterView,
    request: router_pb2.RouteRequest,
    *,
    rng: random.Random,
    assigned: Mapping[str, int],
) -> tuple[router_pb2.Candidate, ...]:
    """Candidates for ``request`` from ``view``, best first (see the module docstring)."""
    allowed = set(request.allowed_regions)
    excluded = set(request.exclude_worker_ids)
    needs = capabilities.Needs.from_pb(request)
    rows: list[tuple[float, float, float, float, router_pb2.WorkerView]] = []
    for w in view.workers:
        if not w.healthy or w.load.draining or w.worker_id in excluded:
            continue
        if allowed and w.region not in allowed:
            continue
        if not _serves(w, request.model, needs):
            continue
        busy = w.load.running + w.load.waiting + w.in_flight_assigned + assigned.get(w.worker_id, 0)
        load = busy / max(w.load.max_running, 1)
        rows.append((round(load, 1), w.rtt_ms, rng.random(), load, w))
    rows.sort(key=lambda r: r[:3])
    return tuple(
        router_pb2.Candidate(
            worker_id=w.worker_id,
            region=w.region,
            address=w.address,
            score=max(0.0, 1.0 - min(load, 1.0)),
        )
        for _, _, _, load, w in rows
    )


class ResilientRouter:
    """The router client the pipeline uses: the router first, the last view if it is gone."""

    def __init__(
        self,
        *,
        client: RouterClient,
        clock: Clock,
        counters: EdgeCounters,
        config: ViewConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self._clock = clock
        self._counters = counters
        self._config = config or ViewConfig()
        self._rng = rng or random.Random()
        self._view: router_pb2.RouterView | None = None
        self._view_at = 0.0
        self._assigned: dict[str, int] = {}

    def view_age_s(self) -> float | None:
        return None if self._view is None else self._clock.monotonic() - self._view_at

    def _usable_view(self) -> router_pb2.RouterView | None:
        age = self.view_age_s()
        if age is None or age > self._config.max_age_s:
            return None
        return self._view

    def serving_workers(self, model: str, allowed_regions: Sequence[str]) -> int | None:
        """How many workers the last view has ready for ``model`` in ``allowed_regions`` (all
        regions when empty); None without a usable view. Read once per stream by the stream
        stage: a stream with nowhere else to go is not declared stalled early (a slow
        worker that comes back beats a migration with no target)."""
        view = self._usable_view()
        if view is None:
            return None
        allowed = set(allowed_regions)
        return sum(
            1
            for w in view.workers
            if w.healthy
            and not w.load.draining
            and (not allowed or w.region in allowed)
            and _serves(w, model, capabilities.Needs())
        )

    async def route(self, request: router_pb2.RouteRequest) -> RouteResult:
        try:
            return await self.client.route(request)
        except RouterUnreachable as err:
            self._counters.router_unreachable += 1
            return self._fallback(request, err)

    def _fallback(self, request: router_pb2.RouteRequest, err: MeridianError) -> RouteResult:
        view = self._usable_view()
        if view is None:
            self._counters.route_fallback_unavailable += 1
            raise err
        candidates = rank_locally(view, request, rng=self._rng, assigned=self._assigned)
        if not candidates:
            self._counters.route_fallback_unavailable += 1
            unsupported = unsupported_in_view(view, request)
            if unsupported is not None:
                raise unsupported  # as the router would answer: a 400, not a 503
            raise err
        self._counters.route_fallback_used += 1
        first = candidates[0].worker_id
        self._assigned[first] = self._assigned.get(first, 0) + 1
        event(log, "route.fallback", request_id=request.request_id, worker_id=first)
        return RouteResult(
            decision_id=f"local-{uuid.uuid4().hex[:16]}",
            candidates=candidates,
            explanation="router unreachable: ranked locally from its last view",
        )

    async def list_models(self) -> router_pb2.ListModelsResponse:
        try:
            return await self.client.list_models()
        except RouterUnreachable:
            view = self._usable_view()
            if view is None:
                raise
            return models_from_view(view)

    async def ready(self) -> bool:
        """Some model can be served now: by the router's word, or — while it is unreachable —
        by the last view (a healthy worker whose model is loaded, not merely a live worker)."""
        if await self.client.ready():
            return True
        view = self._usable_view()
        return view is not None and len(models_from_view(view).models) > 0

    def report_outcome(self, report: router_pb2.OutcomeReport) -> None:
        self.client.report_outcome(report)

    async def refresh(self) -> None:
        """Fetch the router's view now (raises MeridianError if it is unreachable)."""
        view = await self.client.get_view()
        self._view = view
        self._view_at = self._clock.monotonic()
        self._assigned.clear()
        self._counters.view_refreshes += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the view fresh until ``stop``."""
        while not stop.is_set():
            try:
                await self.refresh()
            except MeridianError:
                self._counters.view_refresh_failures += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._config.refresh_every_s)

    async def close(self) -> None:
        await self.client.close()


def unsupported_in_view(
    view: router_pb2.RouterView, request: router_pb2.RouteRequest
) -> InvalidRequest | None:
    """The router's UNSUPPORTED answer, from the view: the model is served in the allowed
    regions, but no worker of it has what the request needs."""
    needs = capabilities.Needs.from_pb(request)
    allowed = set(request.allowed_regions)
    miss: capabilities.Unmet | None = None
    for w in view.workers:
        if allowed and w.region not in allowed:
            continue
        for m in w.load.models:
            if m.name != request.model:
                continue
            found = capabilities.unmet(capabilities.Capabilities.from_pb(m), needs)
            if found is None:
                return None  # someone could serve it: unavailable, not unsupported
            miss = miss or found
    if miss is None:
        return None
    return InvalidRequest(
        f"Unsupported on this deployment: model '{request.model}' {miss.reason}, on every "
        f"worker serving it ('{miss.param}').",
        param=miss.param,
        code=capabilities.UNSUPPORTED_CODE,
    )


def models_from_view(view: router_pb2.RouterView) -> router_pb2.ListModelsResponse:
    served: dict[str, tuple[set[str], list[worker_pb2.ModelInfo]]] = {}
    for w in view.workers:
        if not w.healthy:
            continue
        for m in w.load.models:
            if m.state == worker_pb2.MODEL_STATE_READY:
                regions, infos = served.setdefault(m.name, (set(), []))
                regions.add(w.region)
                infos.append(m)
    out = router_pb2.ListModelsResponse()
    for name in sorted(served):
        regions, infos = served[name]
        out.models.add(
            name=name,
            regions=sorted(regions),
            max_model_len=max(m.max_model_len for m in infos),
            capabilities=capabilities.merged(infos),
        )
    return out
