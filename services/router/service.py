"""The router's gRPC service: Route, ReportOutcome, ListModels, GetView, and for operators
WatchFleet and ExplainRequest (services/router/feed.py).

RouteStream is Route and ReportOutcomes over one long-lived stream per edge process: the
same decision, journal, span, metrics and log line per request, without a gRPC call per
request. A unary call costs the router ~0.4 ms of CPU in gRPC alone on loopback, more than
the decision; a message on an open stream about half that, and the outcomes ride along in
the next request's message (bench/router_cpu.py, bench/README.md).

Route turns a request into a :class:`RouteQuery`, asks the scheduler to rank the fleet's
current snapshots, records the assignment (in-flight accounting) and answers with the ranked
candidates and their per-signal contributions. An empty decision becomes the gRPC status its
reason maps to (see proto/meridian/v1/router.proto): SATURATED (every allowed worker refuses
this priority tier) is RESOURCE_EXHAUSTED with a retry-after, so the lowest tier is shed first
and the edge answers 429/503 with Retry-After.

Per-signal contributions of every candidate and the filters' verdicts are sent when the
request asks for them (``explain``, as the proto says); the one-line explanation always is.
Building them costs more than the rest of the response, and the edge's hot path does not
read them.

Every decision, routed or empty, goes to the :class:`DecisionJournal` (the debug endpoint's
"last N decisions") and its per-plugin timings to :class:`PluginTimings`.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, Protocol

import grpc
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from meridian.v1 import router_pb2, router_pb2_grpc
from services.common import limits
from services.common import metric_names as mn
from services.common.capabilities import UNSUPPORTED_CODE, Capabilities, Needs
from services.common.clock import Clock
from services.common.errors import (
    InvalidRequest,
    MeridianError,
    ModelNotFound,
    NotFound,
    Overloaded,
    RegionNotAllowed,
    Unavailable,
)
from services.common.grpcutil import Undecodable, abort_with
from services.common.logs import event
from services.common.tracecontext import extract_carrier, extract_metadata
from services.router.feed import FleetFeed, WatcherLimit
from services.router.fleet import Fleet
from services.router.journal import DecisionJournal, JournalEntry, PluginTimings
from services.router.observability import RouterTelemetry, deciding_signal
from services.router.scheduling.framework import SchedulerProfile
from services.router.scheduling.regional import RegionIndex
from services.router.scheduling.types import (
    Decision,
    ModelState,
    NoCandidate,
    Priority,
    RouteQuery,
    WorkerSnapshot,
)

log = logging.getLogger("meridian.router")

MAX_PREFIX_HASHES = 256
MAX_LIST_ITEMS = 64


MAX_OUTCOMES_PER_BATCH = 4096
#: Ids and names a Route request carries (tenant, session, site, regions, workers): they are
#: kept in affinity tables and the journal, and echoed in errors (a 1 MB region name made
#: the answer's metadata too large for gRPC).
MAX_NAME_CHARS = 256

_EMPTY_CONTEXT = Context()
_NO_NAMES: frozenset[str] = frozenset()


class Scheduler(Protocol):
    name: str

    def schedule(self, query: RouteQuery, workers: Sequence[WorkerSnapshot]) -> Decision: ...


_PRIORITY_FROM_PB = {
    router_pb2.PRIORITY_UNSPECIFIED: Priority.STANDARD,
    router_pb2.PRIORITY_LOW: Priority.LOW,
    router_pb2.PRIORITY_STANDARD: Priority.STANDARD,
    router_pb2.PRIORITY_HIGH: Priority.HIGH,
}


_OUTCOMES = frozenset(router_pb2.Outcome.values()) - {router_pb2.OUTCOME_UNSPECIFIED}


def outcome_problem(report: router_pb2.OutcomeReport) -> tuple[str, str] | None:
    """(field, why) when an outcome report cannot be applied: it crossed the network, and an
    unknown outcome used to release its in-flight slot as a success would."""
    if not report.decision_id or len(report.decision_id) > limits.MAX_REQUEST_ID_CHARS:
        return "decision_id", f"decision_id must be 1..{limits.MAX_REQUEST_ID_CHARS} characters"
    if not report.worker_id or len(report.worker_id) > MAX_NAME_CHARS:
        return "worker_id", f"worker_id must be 1..{MAX_NAME_CHARS} characters"
    if report.outcome not in _OUTCOMES:
        return "outcome", f"unknown outcome {report.outcome}"
    if not (math.isfinite(report.ttft_ms) and report.ttft_ms >= 0):
        return "ttft_ms", f"ttft_ms must be a finite number >= 0, got {report.ttft_ms}"
    return None


def query_from_pb(pb: router_pb2.RouteRequest) -> RouteQuery:
    """Validate a Route request (it crossed the network) and build the scheduler's query."""
    if not pb.model:
        raise InvalidRequest("model is required", param="model")
    if len(pb.model) > limits.MAX_MODEL_NAME_CHARS:
        raise InvalidRequest(
            f"model is longer than {limits.MAX_MODEL_NAME_CHARS} characters", param="model"
        )
    if len(pb.request_id) > limits.MAX_REQUEST_ID_CHARS:
        raise InvalidRequest("request_id is too long", param="request_id")
    if pb.priority not in _PRIORITY_FROM_PB:
        raise InvalidRequest(f"unknown priority {pb.priority}", param="priority")
    prefix_hashes = pb.prefix_hashes
    if len(prefix_hashes) > MAX_PREFIX_HASHES:
        raise InvalidRequest(
            f"at most {MAX_PREFIX_HASHES} prefix hashes are accepted", param="prefix_hashes"
        )
    for name, value in (
        ("tenant_id", pb.tenant_id),
        ("session_id", pb.session_id),
        ("edge_site", pb.edge_site),
        ("client_region", pb.client_region),
    ):
        if len(value) > MAX_NAME_CHARS:
            raise InvalidRequest(f"{name} is longer than {MAX_NAME_CHARS} characters", param=name)
    regions, excluded = pb.allowed_regions, pb.exclude_worker_ids
    for name, items in (("allowed_regions", regions), ("exclude_worker_ids", excluded)):
        if len(items) > MAX_LIST_ITEMS:
            raise InvalidRequest(f"at most {MAX_LIST_ITEMS} {name} are accepted", param=name)
        if any(not item or len(item) > MAX_NAME_CHARS for item in items):
            raise InvalidRequest(
                f"every {name} item must be a name of 1..{MAX_NAME_CHARS} characters", param=name
            )
    # Most requests name no regions and exclude no one: the empty sets are shared.
    return RouteQuery(
        request_id=pb.request_id,
        model=pb.model,
        tenant_id=pb.tenant_id,
        priority=_PRIORITY_FROM_PB[pb.priority],
        allowed_regions=frozenset(regions) if regions else _NO_NAMES,
        edge_site=pb.edge_site,
        client_region=pb.client_region,
        prompt_tokens=pb.prompt_tokens,
        max_tokens=pb.max_tokens,
        session_id=pb.session_id,
        prefix_hashes=tuple(prefix_hashes),
        exclude_worker_ids=frozenset(excluded) if excluded else _NO_NAMES,
        needs=Needs.from_pb(pb),
    )


def unsupported_error(decision: Decision, query: RouteQuery) -> MeridianError:
    """A 400 naming the request field whose feature no worker of the model has (the
    ``capability`` filter's verdict, recomputed for the message)."""
    verdict = next(
        (r.reason for r in decision.rejected if r.filter == "capability"),
        f"model: model '{query.model}' is not served with what this request needs",
    )
    param, _, why = verdict.partition(": ")
    return InvalidRequest(
        f"Unsupported on this deployment: {why}, on every worker serving it ('{param}').",
        param=param,
        code=UNSUPPORTED_CODE,
    )


def error_for(decision: Decision, query: RouteQuery) -> MeridianError:
    reason = decision.empty_reason or NoCandidate.UNAVAILABLE
    detail = decision.explanation
    if reason is NoCandidate.UNKNOWN_MODEL:
        return ModelNotFound(f"The model '{query.model}' does not exist", param="model")
    if reason is NoCandidate.REGION_NOT_ALLOWED:
        regions = ", ".join(sorted(query.allowed_regions))
        return RegionNotAllowed(
            f"model '{query.model}' is not served in the regions this request may use ({regions})",
            param="model",
        )
    if reason is NoCandidate.UNSUPPORTED:
        return unsupported_error(decision, query)
    if reason is NoCandidate.SATURATED:
        return Overloaded(
            f"no capacity for model '{query.model}' at this priority right now; {detail}",
            retry_after_s=decision.retry_after_s or 1.0,
        )
    return Unavailable(
        f"no healthy worker can serve model '{query.model}' right now; {detail}",
        retry_after_s=decision.retry_after_s or 1.0,
    )


#: Decisions whose failed outcomes still count (about a minute at 1,000 decisions a second;
#: ~8 MiB): a stream that fails later than that does not count towards its worker's ejection.
MAX_REMEMBERED_DECISIONS = 65_536


class LogThrottle:
    """At most one log line per key per ``interval_s``; says how many were left out."""

    def __init__(self, *, interval_s: float) -> None:
        self._interval_s = interval_s
        self._state: dict[tuple[str, ...], tuple[float, int]] = {}

    def allow(self, key: tuple[str, ...], now: float) -> int | None:
        """``None`` to stay quiet; else the number of lines left out since the last one."""
        last, skipped = self._state.get(key, (-math.inf, 0))
        if now - last < self._interval_s:
            self._state[key] = (last, skipped + 1)
            return None
        self._state[key] = (now, 0)
        return skipped


class RouterService(router_pb2_grpc.RouterServicer):
    def __init__(
        self,
        *,
        fleet: Fleet,
        scheduler: Scheduler,
        clock: Clock,
        site: str = "",
        journal: DecisionJournal | None = None,
        timings: PluginTimings | None = None,
        telemetry: RouterTelemetry | None = None,
    ) -> None:
        self._fleet = fleet
        self.telemetry = telemetry or RouterTelemetry()
        self._scheduler = scheduler
        self._regions = RegionIndex()
        self._clock = clock
        self._site = site
        self.journal = journal if journal is not None else DecisionJournal()
        self.timings = timings if timings is not None else PluginTimings()
        # Decision ids: the fleet's random prefix per replica process and a counter, unique
        # across replicas without a uuid per call (the fleet tells its own from the prefix).
        self._id_prefix = fleet.id_prefix
        self._ids = itertools.count(1)
        #: This router's recent decisions and the workers each one offered: a failed outcome
        #: counts against a worker only if it names one of them, once (an outcome naming a
        #: decision nobody made could otherwise eject the whole fleet).
        self._offered: dict[str, tuple[str, ...]] = {}
        # Under overload every decision of a tier can be empty: one log line per second per
        # (reason, tier), with the count of the ones left out (the journal counts them all).
        self._empty_log = LogThrottle(interval_s=1.0)
        self.feed = FleetFeed(journal=self.journal, view=self.view)

    @property
    def fleet(self) -> Fleet:
        return self._fleet

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def site(self) -> str:
        return self._site

    @property
    def profile(self) -> str:
        return self._scheduler.name

    def dry_run(self, query: RouteQuery) -> tuple[Decision, float]:
        """Decide without assigning (the debug endpoint): the decision and its cost in µs.

        Nothing is counted in flight. Stateful plugins still see the decision (a round-robin
        picker advances; affinity plugins learn only from queries with a session or prefix,
        which the debug endpoint does not send)."""
        started = time.perf_counter_ns()
        decision = self._decide(query, self._clock.monotonic())
        return decision, (time.perf_counter_ns() - started) / 1000

    def _decide(self, query: RouteQuery, now: float) -> Decision:
        """The scheduler's decision over the fleet now: through the profile's region
        pre-selection when it has one (the fleet's rows grouped and summarised per region,
        incrementally: ``scheduling/regional.py``), else over every worker."""
        snapshots = self._fleet.snapshots(now)
        scheduler = self._scheduler
        if isinstance(scheduler, SchedulerProfile) and scheduler.regions is not None:
            return scheduler.schedule_view(query, self._regions.update(snapshots))
        return scheduler.schedule(query, snapshots)

    async def Route(
        self,
        request: router_pb2.RouteRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> router_pb2.RouteResponse:
        try:
            return self._route_traced(request, extract_metadata(context.invocation_metadata()))
        except MeridianError as err:
            await abort_with(context, err)
            raise AssertionError("unreachable") from None

    async def RouteStream(
        self,
        request_iterator: AsyncIterator[router_pb2.RouteStreamRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        """Route and outcomes over one stream (see the proto): each message's outcomes are
        applied, then its request decided exactly as :meth:`Route` decides it; an error is
        sent as the status unary Route would have ended with, and the stream goes on.
        ``context.read``/``write`` rather than iterating and yielding: the same messages for
        less of gRPC's per-message machinery."""
        while (msg := await context.read()) is not grpc.aio.EOF:
            if isinstance(msg, Undecodable):
                await abort_with(context, InvalidRequest(msg.why))
            if len(msg.outcomes) > MAX_OUTCOMES_PER_BATCH:
                await abort_with(
                    context,
                    InvalidRequest(
                        f"at most {MAX_OUTCOMES_PER_BATCH} outcomes per message", param="outcomes"
                    ),
                )
            if msg.outcomes:
                self._outcomes(msg.outcomes, drop_malformed=True)
            if not msg.call_id:
                continue
            parent = extract_carrier(msg.metadata) if msg.metadata else _EMPTY_CONTEXT
            # The decision is written straight into the answer's ``response`` (building a
            # RouteResponse and passing it to the constructor would copy it).
            answer = router_pb2.RouteStreamResponse(call_id=msg.call_id)
            try:
                self._route_traced(msg.request, parent, answer.response)
            except MeridianError as err:
                answer = router_pb2.RouteStreamResponse(
                    call_id=msg.call_id,
                    code=err.grpc_code.value[0],
                    message=err.message,
                    trailers=dict(err.grpc_trailers()),
                )
            await context.write(answer)

    def _route_traced(
        self,
        request: router_pb2.RouteRequest,
        parent: Context,
        into: router_pb2.RouteResponse | None = None,
    ) -> router_pb2.RouteResponse:
        """One decision in its ``router.Route`` span, written into ``into`` (a new response
        when ``None``) and returned; raises the MeridianError an empty or invalid request
        ends with (the span records it)."""
        with self.telemetry.tracer.start_as_current_span(
            "router.Route", context=parent, kind=SpanKind.SERVER
        ) as span:
            return self._route(request, span, into)

    def _route(
        self,
        request: router_pb2.RouteRequest,
        span: trace.Span,
        into: router_pb2.RouteResponse | None = None,
    ) -> router_pb2.RouteResponse:
        started = time.perf_counter_ns()
        try:
            query = query_from_pb(request)
        except MeridianError as err:
            span.set_status(Status(StatusCode.ERROR, err.message))
            raise
        if span.is_recording():
            span.set_attribute("meridian.request_id", query.request_id)
            span.set_attribute(mn.MODEL, query.model)
            span.set_attribute("meridian.priority", query.priority.name.lower())
        now = self._clock.monotonic()
        decision = self._decide(query, now)
        self.timings.record(decision.plugin_timings_us)
        if not decision.ranked:
            elapsed_us = (time.perf_counter_ns() - started) / 1000
            self.telemetry.record(decision, elapsed_us, span)
            self.journal.record(JournalEntry(time.time(), "", query, decision, elapsed_us))
            reason = (decision.empty_reason or NoCandidate.UNAVAILABLE).value
            priority = query.priority.name.lower()
            suppressed = self._empty_log.allow((reason, priority), now)
            if suppressed is not None:
                event(
                    log,
                    "route.empty",
                    request_id=query.request_id,
                    model=query.model,
                    priority=priority,
                    reason=reason,
                    retry_after_s=decision.retry_after_s,
                    detail=decision.explanation,
                    suppressed_since_last=suppressed,
                )
            raise error_for(decision, query)
        decision_id = f"{self._id_prefix}{next(self._ids):x}"
        winner = decision.ranked[0]
        self._fleet.assign(winner.worker.worker_id, decision_id, now)
        offered = self._offered
        offered[decision_id] = tuple(c.worker.worker_id for c in decision.ranked)
        if len(offered) > MAX_REMEMBERED_DECISIONS:
            del offered[next(iter(offered))]  # the oldest (dicts keep insertion order)
        elapsed_us = (time.perf_counter_ns() - started) / 1000
        self.telemetry.record(decision, elapsed_us, span)
        span.set_attribute("meridian.decision_id", decision_id)
        self.journal.record(JournalEntry(time.time(), decision_id, query, decision, elapsed_us))
        event(
            log,
            "route.decided",
            request_id=query.request_id,
            decision_id=decision_id,
            model=query.model,
            worker_id=winner.worker.worker_id,
            region=winner.worker.region,
            score=round(winner.score, 4),
            explanation=decision.explanation,
            decision_us=round(elapsed_us, 1),
        )
        return self._response(decision, decision_id, elapsed_us, explain=request.explain, into=into)

    async def ReportOutcome(
        self,
        request: router_pb2.OutcomeReport,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> router_pb2.OutcomeAck:
        problem = outcome_problem(request)
        if problem is not None:
            self.telemetry.refused_outcomes[problem[0]] += 1
            await abort_with(context, InvalidRequest(problem[1], param=problem[0]))
        self._outcome(request, self._clock.monotonic())
        return router_pb2.OutcomeAck()

    async def ReportOutcomes(
        self,
        request: router_pb2.OutcomeBatch,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> router_pb2.OutcomeAck:
        if len(request.reports) > MAX_OUTCOMES_PER_BATCH:
            await abort_with(
                context,
                InvalidRequest(
                    f"at most {MAX_OUTCOMES_PER_BATCH} outcomes per batch", param="reports"
                ),
            )
        for i, report in enumerate(request.reports):  # all or nothing: the batch is refused
            problem = outcome_problem(report)
            if problem is not None:
                self.telemetry.refused_outcomes[problem[0]] += 1
                await abort_with(
                    context, InvalidRequest(problem[1], param=f"reports[{i}].{problem[0]}")
                )
        self._outcomes(request.reports)
        return router_pb2.OutcomeAck()

    def _outcomes(
        self, reports: Iterable[router_pb2.OutcomeReport], *, drop_malformed: bool = False
    ) -> None:
        now = self._clock.monotonic()
        for report in reports:
            if drop_malformed:
                problem = outcome_problem(report)
                if problem is not None:  # counted; the stream and its requests go on
                    self.telemetry.refused_outcomes[problem[0]] += 1
                    continue
            self._outcome(report, now)

    def _outcome(self, report: router_pb2.OutcomeReport, now: float) -> None:
        """An attempt ended: release its in-flight slot; a failure counts towards ejection."""
        failed = report.outcome == router_pb2.OUTCOME_FAILED
        if failed:
            offered = self._offered.get(report.decision_id, ())
            failed = report.worker_id in offered
            if failed:  # one failure per worker and decision
                self._offered[report.decision_id] = tuple(
                    w for w in offered if w != report.worker_id
                )
        self._fleet.on_outcome(report.worker_id, report.decision_id, failed, now)

    async def ListModels(
        self,
        request: router_pb2.ListModelsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> router_pb2.ListModelsResponse:
        models: dict[str, tuple[set[str], int, Capabilities, int]] = {}
        for w in self._fleet.snapshots(self._clock.monotonic()):
            if not w.healthy:
                continue
            for m in w.models:
                if m.state is ModelState.READY:
                    seen = models.get(m.name)
                    if seen is None:
                        models[m.name] = (
                            {w.region},
                            m.max_model_len,
                            m.capabilities,
                            m.created_unix_s,
                        )
                    else:
                        seen[0].add(w.region)
                        models[m.name] = (
                            seen[0],
                            max(seen[1], m.max_model_len),
                            seen[2].merge(m.capabilities),
                            _earliest(seen[3], m.created_unix_s),
                        )
        return router_pb2.ListModelsResponse(
            models=[
                router_pb2.ServedModel(
                    name=name,
                    regions=sorted(regions),
                    max_model_len=max_len,
                    capabilities=caps.to_pb(),
                    created_unix_s=created,
                )
                for name, (regions, max_len, caps, created) in sorted(models.items())
            ]
        )

    async def GetView(
        self,
        request: router_pb2.GetViewRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> router_pb2.RouterView:
        return self.view()

    def view(self) -> router_pb2.RouterView:
        """Every worker this router knows, as GetView (and the WatchFleet feed) answer it."""
        now = self._clock.monotonic()
        view = router_pb2.RouterView(
            router_site=self._site, generated_unix_ms=int(time.time() * 1000)
        )
        for w in sorted(self._fleet.snapshots(now), key=lambda s: (s.region, s.worker_id)):
            wv = view.workers.add(
                worker_id=w.worker_id,
                region=w.region,
                address=w.address,
                healthy=w.healthy,
                health_detail=w.health_detail,
                rtt_ms=w.rtt_ms or 0.0,
                loss=w.loss,
                report_age_ms=w.report_age_s * 1000,
                in_flight_assigned=w.in_flight,
            )
            report = self._fleet.last_report(w.worker_id)
            if report is not None:
                wv.load.CopyFrom(report)
        return view

    async def WatchFleet(
        self,
        request: router_pb2.WatchFleetRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        try:
            self.feed.acquire()
        except WatcherLimit as err:
            await abort_with(context, Overloaded(str(err), retry_after_s=5.0))
        event(log, "feed.watching", watchers=self.feed.watchers)
        try:
            async for update in self.feed.stream(request):
                await context.write(update)
        finally:
            self.feed.release()
            event(log, "feed.stopped", watchers=self.feed.watchers)

    async def ExplainRequest(
        self,
        request: router_pb2.ExplainRequestQuery,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> router_pb2.RequestExplanation:
        if not request.request_id:
            await abort_with(context, InvalidRequest("request_id is required", param="request_id"))
        if len(request.request_id) > limits.MAX_REQUEST_ID_CHARS:
            await abort_with(
                context,
                InvalidRequest(
                    f"request_id is longer than {limits.MAX_REQUEST_ID_CHARS} characters",
                    param="request_id",
                ),
            )
        entries = [
            e
            for e in self.journal.for_request(request.request_id)
            if e.query.tenant_id == request.tenant_id
        ]
        if not entries:
            await abort_with(
                context,
                NotFound(f"no decision for request '{request.request_id}' is kept here"),
            )
        out = router_pb2.RequestExplanation(request_id=request.request_id)
        for e in entries:
            item = out.decisions.add(
                at_unix_ms=int(e.at_unix * 1000),
                signal=deciding_signal(e.decision),
                exclude_worker_ids=sorted(e.query.exclude_worker_ids),
            )
            if e.decision.empty_reason is not None:
                item.empty_reason = e.decision.empty_reason.value
            item.decision.CopyFrom(
                self._response(e.decision, e.decision_id, e.decision_us, explain=True)
            )
        return out

    def _response(
        self,
        decision: Decision,
        decision_id: str,
        elapsed_us: float,
        *,
        explain: bool,
        into: router_pb2.RouteResponse | None = None,
    ) -> router_pb2.RouteResponse:
        """The decision as a RouteResponse, written into ``into`` (an empty message: a
        stream answer's field) when given."""
        resp = router_pb2.RouteResponse() if into is None else into
        resp.decision_id = decision_id
        resp.explanation = decision.explanation
        resp.decision_us = elapsed_us
        resp.router_site = self._site
        for scored in decision.ranked:
            cand = resp.candidates.add(
                worker_id=scored.worker.worker_id,
                region=scored.worker.region,
                address=scored.worker.address,
                score=scored.score,
            )
            if not explain:
                continue
            for c in scored.contributions:
                cand.contributions.add(
                    signal=c.signal,
                    score=c.score,
                    weight=c.weight,
                    weighted=c.weighted,
                    detail=c.detail,
                )
        if explain:
            for r in decision.rejected:
                resp.filtered.add(
                    worker_id=r.worker_id, region=r.region, filter=r.filter, reason=r.reason
                )
        return resp


def _earliest(a: int, b: int) -> int:
    """The earlier of two ``created_unix_s``, where 0 means a worker that does not say."""
    return min(a, b) if a and b else a or b
