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
falling back are added to the load of their worker until their outcome is reported (the
request ended), the next view arrives, or ``assigned_ttl_s`` (about a request's life) has
passed, so a burst does not pile onto one worker while finished requests stop counting (counts
that only aged out made ~5 s of light traffic look like a full fleet, and load steps of 0.1
then spread it round-robin over every region). The age limit matters when the router is hung:
no view arrives, and an outcome can be lost. A worker this edge saw fail (an outcome
``FAILED``) within ``failed_for_s`` is ranked after every other candidate: the last view
cannot know it died, and it would otherwise stay first.

The fallback is used only when the router did not answer (:class:`RouterUnreachable`: a
deadline, a refused connection); a router that answers with an error (unknown model, no
capacity) is obeyed. It is counted, and it stops when the view is older than ``max_age_s``.

Backoff: after ``backoff_after`` unanswered calls in a row (``RouterUnreachable``; two by
default: one may be a slow answer on a busy host, and the view it would fall back to may be
seconds old — a worker that just began draining still looks ready there) the router is not
asked on the request path (Route, ListModels, readiness) at all, because a hung router
(SIGSTOP, a wedged loop) accepts connections and never answers, and every request asking it
would wait the whole deadline (~2 s). Requests are ranked from the view at once (counted
as ``route_fallback_backed_off`` too), while one background probe — never more, and no
request waits for it — asks the router for its view after a jittered period
(``backoff_initial_s``, doubling to ``backoff_max_s``).
When the router answers it (even with an error), requests ask the router again: a router that
recovers is used within about one period, and the answer is a fresh view as well. The probe is
``GetView``, not a Route, so that it makes no decision and adds no in-flight load at the
router; the price is a router whose GetView answers while its Route hangs, so the period is
reset only when a Route is answered — such a router makes requests wait its deadline once per
period, not on every request. Entering and leaving the backoff are logged once each
(``router.backoff_started``, ``router.back``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections import deque
from collections.abc import Container, Mapping, Sequence
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
    #: How long requests are ranked from the view without asking a router that did not
    #: answer, before the probe asks it; doubled after each unanswered probe, up to the max.
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 5.0
    #: Unanswered calls in a row (none answered in between) that start the backoff.
    backoff_after: int = 2
    #: How long a request routed from the view counts as load on its worker, at most.
    assigned_ttl_s: float = 5.0
    failed_for_s: float = 5.0
    #: How long a model listing is reused: ``/v1/models`` is a GET any key can repeat, and
    #: each was a call to the router (which walks its whole fleet to answer).
    models_fresh_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.refresh_every_s <= self.max_age_s:
            raise ValueError("need 0 < refresh_every_s <= max_age_s")
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s")
        if self.backoff_after < 1:
            raise ValueError("need backoff_after >= 1")
        if self.assigned_ttl_s <= 0:
            raise ValueError("need assigned_ttl_s > 0")
        if self.failed_for_s < 0:
            raise ValueError("need failed_for_s >= 0")
        if self.models_fresh_s < 0:
            raise ValueError("need models_fresh_s >= 0")


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
    failed: Container[str] = frozenset(),
) -> tuple[router_pb2.Candidate, ...]:
    """Candidates for ``request`` from ``view``, best first (see the module docstring);
    workers in ``failed`` last."""
    allowed = set(request.allowed_regions)
    excluded = set(request.exclude_worker_ids)
    needs = capabilities.Needs.from_pb(request)
    rows: list[tuple[bool, float, float, float, float, router_pb2.WorkerView]] = []
    for w in view.workers:
        if not w.healthy or w.load.draining or w.worker_id in excluded:
            continue
        if allowed and w.region not in allowed:
            continue
        if not _serves(w, request.model, needs):
            continue
        busy = w.load.running + w.load.waiting + w.in_flight_assigned + assigned.get(w.worker_id, 0)
        load = busy / max(w.load.max_running, 1)
        rows.append((w.worker_id in failed, round(load, 1), w.rtt_ms, rng.random(), load, w))
    rows.sort(key=lambda r: r[:4])
    return tuple(
        router_pb2.Candidate(
            worker_id=w.worker_id,
            region=w.region,
            address=w.address,
            score=max(0.0, 1.0 - min(load, 1.0)),
        )
        for _, _, _, _, load, w in rows
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
        # Requests routed from the view since it arrived and not yet ended, by worker; each
        # local decision's worker; when each was made (oldest first); workers seen failing.
        self._assigned: dict[str, int] = {}
        self._local: dict[str, str] = {}
        self._assigned_at: deque[tuple[float, str]] = deque()
        self._failed_at: dict[str, float] = {}
        # The backoff (module docstring): when it started (None: ask the router), the period
        # the next one starts with, how many have ended, and the one probe.
        self._backed_off_at: float | None = None
        self._backoff_s = self._config.backoff_initial_s
        self._recoveries = 0
        self._unanswered = 0  # calls in a row the router did not answer
        self._skipped_before = 0  # route_fallback_backed_off when the backoff started
        self._probe: asyncio.Task[None] | None = None
        self._jitter = random.Random()
        # The last model listing and when it came; the one call for it in flight, if any.
        self._models: router_pb2.ListModelsResponse | None = None
        self._models_at = 0.0
        self._models_call: asyncio.Future[router_pb2.ListModelsResponse] | None = None

    @property
    def backed_off(self) -> bool:
        """The router did not answer and is not asked until the probe hears from it."""
        return self._backed_off_at is not None

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
        if self._backed_off_at is not None:
            self._counters.route_fallback_backed_off += 1
            return self._fallback(request, _not_asked())
        recoveries = self._recoveries
        try:
            result = await self.client.route(request)
        except RouterUnreachable as err:
            self._counters.router_unreachable += 1
            self._back_off(err, recoveries)
            return self._fallback(request, err)
        except MeridianError:
            self._answered()  # an answer, with an error: Route works
            raise
        self._answered()
        return result

    def _answered(self) -> None:
        self._backoff_s = self._config.backoff_initial_s
        self._unanswered = 0

    def _fallback(self, request: router_pb2.RouteRequest, err: MeridianError) -> RouteResult:
        view = self._usable_view()
        if view is None:
            self._counters.route_fallback_unavailable += 1
            raise err
        candidates = rank_locally(
            view, request, rng=self._rng, assigned=self._assigned_now(), failed=self._failed_now()
        )
        if not candidates:
            self._counters.route_fallback_unavailable += 1
            unsupported = unsupported_in_view(view, request)
            if unsupported is not None:
                raise unsupported  # as the router would answer: a 400, not a 503
            raise err
        self._counters.route_fallback_used += 1
        first = candidates[0].worker_id
        decision_id = f"local-{uuid.uuid4().hex[:16]}"
        self._assigned[first] = self._assigned.get(first, 0) + 1
        self._local[decision_id] = first
        self._assigned_at.append((self._clock.monotonic(), decision_id))
        event(log, "route.fallback", request_id=request.request_id, worker_id=first)
        return RouteResult(
            decision_id=decision_id,
            candidates=candidates,
            explanation="router unreachable: ranked locally from its last view",
        )

    def _assigned_now(self) -> Mapping[str, int]:
        """The fallback's own load per worker, without what is older than ``assigned_ttl_s``."""
        cutoff = self._clock.monotonic() - self._config.assigned_ttl_s
        while self._assigned_at and self._assigned_at[0][0] <= cutoff:
            self._release(self._assigned_at.popleft()[1])
        return self._assigned

    def _release(self, decision_id: str) -> None:
        """A local decision's request ended (or aged out): its worker's count goes down."""
        worker_id = self._local.pop(decision_id, None)
        if worker_id is None:
            return  # released already (its outcome, then its age), or from an older view
        if (left := self._assigned[worker_id] - 1) > 0:
            self._assigned[worker_id] = left
        else:
            del self._assigned[worker_id]

    def _failed_now(self) -> Container[str]:
        if not self._failed_at:
            return frozenset()
        cutoff = self._clock.monotonic() - self._config.failed_for_s
        for worker_id in [w for w, at in self._failed_at.items() if at <= cutoff]:
            del self._failed_at[worker_id]
        return self._failed_at.keys()

    def _back_off(self, err: RouterUnreachable, recoveries: int) -> None:
        """Stop asking the router, and start the probe — unless it is backed off already, or
        the probe heard from it while this call waited (a late timeout is no news)."""
        if self._backed_off_at is not None or recoveries != self._recoveries:
            return
        self._unanswered += 1
        if self._unanswered < self._config.backoff_after:
            return  # this request fell back alone; the next one asks the router again
        self._unanswered = 0
        period = self._backoff_s
        self._backoff_s = min(period * 2, self._config.backoff_max_s)
        self._backed_off_at = self._clock.monotonic()
        self._skipped_before = self._counters.route_fallback_backed_off
        event(
            log,
            "router.backoff_started",
            level=logging.WARNING,
            backoff_s=period,
            error=err.message,
        )
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._probe_until_back(period), name="router probe")

    async def _probe_until_back(self, period: float) -> None:
        """Ask the router for its view every jittered ``period`` (doubling) until it answers."""
        while self._backed_off_at is not None:
            await asyncio.sleep(period * (0.5 + 0.5 * self._jitter.random()))
            try:
                await self.refresh()
            except RouterUnreachable:
                period = min(period * 2, self._config.backoff_max_s)
                self._backoff_s = period  # the next backoff starts where this one got to
                continue
            except MeridianError:
                pass  # it answered, with an error: it is there to be asked
            except Exception:  # a bug here must not leave the router unasked for good
                log.exception("router.probe_failed")
            self._router_back()

    def _router_back(self) -> None:
        if self._backed_off_at is None:
            return
        event(
            log,
            "router.back",
            backed_off_s=round(self._clock.monotonic() - self._backed_off_at, 3),
            routed_locally=self._counters.route_fallback_backed_off - self._skipped_before,
        )
        self._backed_off_at = None
        self._recoveries += 1

    async def list_models(self) -> router_pb2.ListModelsResponse:
        """The models the fleet serves: a listing younger than ``models_fresh_s`` is reused,
        and whoever asks while one is on its way waits for that one — a burst of ``/v1/models``
        from many keys is one router call a second, not one each. A caller that goes away does
        not cancel the call the others wait on."""
        fresh = self._models
        if (
            fresh is not None
            and self._clock.monotonic() - self._models_at < self._config.models_fresh_s
        ):
            return fresh
        if self._models_call is None:
            call = asyncio.ensure_future(self._ask_models())
            call.add_done_callback(self._models_answered)
            self._models_call = call
        return await asyncio.shield(self._models_call)

    def _models_answered(self, call: asyncio.Future[router_pb2.ListModelsResponse]) -> None:
        self._models_call = None
        if not call.cancelled() and call.exception() is None:
            self._models = call.result()
            self._models_at = self._clock.monotonic()

    async def _ask_models(self) -> router_pb2.ListModelsResponse:
        recoveries = self._recoveries
        try:
            if self._backed_off_at is not None:
                raise _not_asked()
            models = await self.client.list_models()
            self._unanswered = 0
            return models
        except RouterUnreachable as err:
            self._back_off(err, recoveries)
            view = self._usable_view()
            if view is None:
                raise
            return models_from_view(view)

    async def ready(self) -> bool:
        """Some model can be served now: by the router's word, or — while it is unreachable —
        by the last view (a healthy worker whose model is loaded, not merely a live worker).
        A backed-off router is not asked (a probe with a 1 s timeout would fail on it)."""
        if self._backed_off_at is None and await self.client.ready():
            return True
        view = self._usable_view()
        return view is not None and len(models_from_view(view).models) > 0

    def report_outcome(self, report: router_pb2.OutcomeReport) -> None:
        if report.outcome == router_pb2.OUTCOME_FAILED:
            self._failed_at[report.worker_id] = self._clock.monotonic()
        if self._local:
            self._release(report.decision_id)
        self.client.report_outcome(report)

    async def refresh(self) -> None:
        """Fetch the router's view now (raises MeridianError if it is unreachable)."""
        view = await self.client.get_view()
        self._view = view
        self._view_at = self._clock.monotonic()
        self._assigned.clear()
        self._local.clear()
        self._assigned_at.clear()
        self._failed_at.clear()  # the router's view says who is healthy now
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
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        if self._models_call is not None:
            self._models_call.cancel()
        await self.client.close()


def _not_asked() -> RouterUnreachable:
    """What a request gets when the router is backed off and the view cannot route it."""
    return RouterUnreachable("the router is not answering; try again shortly", retry_after_s=1.0)


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
