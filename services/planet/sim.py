"""The discrete-event loop: the planet in virtual time.

Everything happens on one heap of timestamped events; nothing sleeps, nothing reads a real
clock. One request follows the edge's path (``services/edge/upstream/failover.py``):

    arrival at an edge site ─▶ that site's router replica decides (the router's own
    SchedulerProfile, loaded from the same YAML profile, on this replica's aged view: :mod:`.view`)
      ─▶ after route_ms + service_ms + one-way delay the primary worker gets it (a dead one:
         the edge learns one way later — a connect timeout if partitioned — and tries the next
         candidate, then asks the router again with the tried ones excluded, up to max_attempts)
      ─▶ the worker's engine model batches it (:mod:`.fastworker` or :mod:`.exactworker`)
      ─▶ first token and end reach the edge one way later (TTFT, ITL, e2e measured there)
      ─▶ the edge's outcome report ends the replica's in-flight assignment.

Workers send load reports every ``report_interval`` (and early ones, 20 ms after a request
ends, when they were last reported near full — ``services/worker/service.py``); reports reach
every replica after that replica's one-way delay. Streams in flight on a worker that dies
resume on another (their delivered tokens become prompt), as the edge does.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import random
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from services.planet.demand import Demand, Request
from services.planet.exactworker import ExactWorker
from services.planet.fastworker import FastWorker, Job
from services.planet.metrics import Metrics
from services.planet.network import Network
from services.planet.scenario import Event, Scenario
from services.planet.view import HEALTH, LINK, OUTCOME, RegionLog, Report, SiteView, StaticWorker
from services.router.scheduling.framework import SchedulerProfile
from services.router.scheduling.profile import load_profile
from services.router.scheduling.types import ModelState, ModelStatus, RouteQuery

ARRIVE, DELIVER, WAKE, REPORT, FAILBACK, FAULT, TICK = range(7)
EARLY_REPORT_S = 0.02  # services/worker/service.py MIN_REPORT_INTERVAL_S
# A load report built from one tuple at C level (``Report._make`` without its Python frame):
# thousands per simulated second.
_new_report = cast("Callable[[type[Report], tuple[Any, ...]], Report]", tuple.__new__)


class VirtualClock:
    """The ``Clock`` the router's plugins read (affinity expiry), set by the loop."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1.7e9 + self.now


@contextmanager
def long_lived_heap() -> Iterator[None]:
    """Keep the cyclic garbage collector off the set-up's objects during a run.

    A planet's set-up leaves ~300,000 long-lived objects (every replica's snapshots, the
    engines, the logs); at CPython's default thresholds each full collection walks all of
    them again, which was ~17 % of a 10,000-worker run's CPU. They are frozen (never scanned)
    for the run, and the young generation is collected less often: the event loop's garbage is
    freed by reference counting, so rarer collections only find the few cycles later (peak RSS
    unchanged). Restored afterwards: the process may go on to do other things."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@dataclass(slots=True, eq=False)
class BackgroundStream:
    """Load this simulation does not route: another site's traffic, fed to one engine."""

    region: int
    prompt: int
    max_tokens: int
    messages: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RunStats:
    wall_s: float
    cpu_s: float  # this process's CPU time: the figure that means something on a shared box
    requests: int
    decisions: int
    events: int
    peak_rss_mib: float


class Planet:
    def __init__(
        self,
        sc: Scenario,
        *,
        profile: Path | None = None,
        progress: Callable[[float], None] | None = None,
        record: bool = False,
    ) -> None:
        self.sc = sc
        #: ``(ttft_ms, region, rid)`` of every first token, when asked (small runs: fidelity
        #: checks pair them with the real stack's request by request)
        self.records: list[tuple[float, str, int]] | None = [] if record else None
        self.profile = profile or sc.router.profile
        self.progress = progress
        self.clock = VirtualClock()
        self.rng = random.Random(sc.seed)
        self.regions = list(sc.fleet_regions)
        self.region_index = {r: i for i, r in enumerate(self.regions)}
        self.site_names = list(sc.sites)
        self.network = Network(sc, self.site_names, self.regions, sc.seed + 17)
        self.static = [
            StaticWorker(
                w.worker_id,
                w.region,
                self.region_index[w.region],
                f"sim://{w.worker_id}",
                w.config.max_num_seqs,
            )
            for w in sc.workers
        ]
        self.index = {w.worker_id: i for i, w in enumerate(self.static)}
        self.max_len = [w.config.max_model_len for w in sc.workers]
        engine_cls = FastWorker if sc.engine == "fast" else ExactWorker
        self.engines = [engine_cls(w.config, self._emitter(i)) for i, w in enumerate(sc.workers)]
        self.up = [True] * len(self.engines)
        self.down_mode = [""] * len(self.engines)
        self.models: list[tuple[ModelStatus, ...]] = [
            tuple(ModelStatus(m, ModelState.READY, w.config.max_model_len) for m in w.models)
            for w in sc.workers
        ]
        self.last_report: list[Report] = [
            self._idle_report(i, 0.0) for i in range(len(self.engines))
        ]
        # id(model list) → (that list, its READY names): see _ready
        self._ready_names: dict[int, tuple[tuple[ModelStatus, ...], tuple[str, ...]]] = {}
        # Each region's aggregate at its source (healthy, slots, busy, {ready model: count})
        # and each worker's part in it: updated once per report, read by every replica's
        # region stage at its own horizon through the region's log.
        self.agg: list[list[Any]] = [[0, 0, 0, {}] for _ in self.regions]
        self.agg_models: list[frozenset[str]] = [frozenset() for _ in self.regions]
        self.part: list[tuple[int, int, int, tuple[str, ...]]] = [(0, 0, 0, ())] * len(self.engines)
        for i in range(len(self.engines)):
            self._account(i)
        self.logs = [RegionLog(self._aggregate(g)) for g in range(len(self.regions))]
        self.report_version = [0] * len(self.engines)
        self.report_pending = [False] * len(self.engines)
        self.report_anchor = [self.rng.random() * sc.router.report_interval_s for _ in self.engines]
        self.admitted: list[list[int]] = [[] for _ in self.engines]
        self.admitted_by = [0] * len(self.engines)  # per worker: bits of the replicas named
        self.last_load = [0.0] * len(self.engines)
        self.views = [
            SiteView(
                s,
                self.static,
                self.network.rtt_ms[si],
                self.network.loss[si],
                self.last_report,
                si,
            )
            for si, s in enumerate(self.site_names)
        ]
        self.schedulers: list[SchedulerProfile] = [
            load_profile(self.profile, clock=self.clock, rng=random.Random(sc.seed * 1000 + si))
            for si in range(len(self.site_names))
        ]
        allowed = self._allowed_sets()
        self.demand = Demand(sc, allowed)
        self.metrics = Metrics(
            slo_ttft_ms=sc.slo_ttft_ms,
            slo_itl_ms=sc.slo_itl_ms,
            interval_s=sc.report_interval_s,
            window_s=sc.oscillation_window_s,
            sample_size=sc.sample_decisions,
            seed=sc.seed,
        )
        self.heap: list[tuple[float, int, int, Any, Any]] = []
        self.seq = itertools.count()
        self.decisions = 0
        self.open = 0  # requests neither finished nor given up
        self.interrupted_at: float | None = None  # simulated time of a Ctrl-C
        self.requests = 0
        self.events = 0
        self._bg_rid = itertools.count(-1, -1)
        self._jobs_bg: dict[int, BackgroundStream] = {}
        # read on every load report
        self._deadband = sc.router.report_deadband
        self._report_interval_s = sc.router.report_interval_s

    # --- set-up --------------------------------------------------------------------------

    def _allowed_sets(self) -> dict[tuple[str, str], frozenset[str]]:
        out = {}
        for t in self.sc.traffic.tenants:
            for s in self.site_names:
                zones = [self.sc.sites[s].zone if z == "local" else z for z in t.residency]
                regions: frozenset[str] = frozenset()
                for z in zones:
                    regions |= self.sc.zone_regions(z)
                if zones and not regions:
                    regions = frozenset({f"(none in zone {','.join(zones)})"})
                out[(t.name, s)] = regions
        return out

    def _account(self, w: int) -> bool:
        """Move worker ``w``'s part of its region's aggregate to its state; True if it moved."""
        rep = self.last_report[w]
        if self.up[w] and not rep.draining:
            cap = self.static[w].max_running
            part = (1, cap, max(0, min(cap, rep.running + rep.waiting)), self._ready(rep.models))
        else:
            part = (0, 0, 0, ())
        old = self.part[w]
        if part == old:
            return False
        g = self.static[w].region_index
        agg = self.agg[g]
        agg[0] += part[0] - old[0]
        agg[1] += part[1] - old[1]
        agg[2] += part[2] - old[2]
        if part[3] != old[3]:
            models: dict[str, int] = agg[3]
            for m in old[3]:
                models[m] -= 1
                if not models[m]:
                    del models[m]
            for m in part[3]:
                models[m] = models.get(m, 0) + 1
            self.agg_models[g] = frozenset(models)
        self.part[w] = part
        return True

    def _ready(self, models: tuple[ModelStatus, ...]) -> tuple[str, ...]:
        """The names of the READY models in a worker's model list. Reports share the list
        object until it changes (a rollout), so this is one look-up per report, not a scan."""
        key = id(models)
        hit = self._ready_names.get(key)
        if hit is None or hit[0] is not models:
            hit = (models, tuple(m.name for m in models if m.state is ModelState.READY))
            self._ready_names[key] = hit
        return hit[1]

    def _aggregate(self, g: int) -> tuple[int, int, int, frozenset[str]]:
        agg = self.agg[g]
        return (agg[0], agg[1], agg[2], self.agg_models[g])

    def _publish(self, w: int, t: float, rep: Report | None) -> None:
        """Append a report (or, ``rep`` None, a change of the worker's state alone) to its
        region's log, with the region's aggregate after it."""
        moved = self._account(w)
        if rep is None and not moved:
            return
        g = self.static[w].region_index
        self.logs[g].append(t, w if rep is not None else -1, rep, self._aggregate(g))

    def _idle_report(self, w: int, t: float) -> Report:
        return Report(t, 0, 0, 0.0, 0.0, 0.0, 0.0, self.models[w], False, ())

    def push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, a, b))

    # --- the run -------------------------------------------------------------------------

    def run(self) -> RunStats:
        with long_lived_heap():
            return self._run()

    def _run(self) -> RunStats:
        sc = self.sc
        started = time.perf_counter()
        cpu_started = time.process_time()
        first = self.demand.next_request()
        if first is not None:
            self.push(first.arrived, ARRIVE, first)
        for i, ev in enumerate(sc.events):
            self.push(ev.at_s, FAULT, i, True)
            if ev.duration_s is not None:
                self.push(
                    ev.at_s + ev.duration_s + (ev.load_s if ev.kind == "model-rollout" else 0),
                    FAULT,
                    i,
                    False,
                )
            if ev.kind == "model-rollout":
                self.push(ev.at_s + ev.load_s, FAULT, i, "ready")
        for bg in sc.background:
            g = self.region_index[bg.region]
            for w, sw in enumerate(self.static):
                if sw.region_index == g:
                    for _ in range(bg.streams_per_worker):
                        self._start_background(
                            w, BackgroundStream(g, bg.prompt_tokens, bg.max_tokens), 0.0
                        )
        self.push(1.0, TICK, 1)
        heap = self.heap
        end = sc.duration_s
        drain_until = end + 600.0  # let streams in flight finish (bounded)
        pop = heapq.heappop
        t = 0.0
        try:
            while heap:
                t, _, kind, a, b = pop(heap)
                if t > drain_until:
                    break
                self.events += 1
                if kind == WAKE:
                    eng = self.engines[a]
                    if eng.version == b:
                        eng.wake(t)
                        self._after_engine(a, t)
                elif kind == REPORT:
                    if self.report_version[a] == b:
                        self._report(a, t)
                elif kind == ARRIVE:
                    self._arrive(a, t)
                elif kind == DELIVER:
                    self._deliver(a, b, t)
                elif kind == FAILBACK:
                    self._failback(a, t)
                elif kind == FAULT:
                    self._fault(sc.events[a], b, t)
                elif kind == TICK:
                    if t <= end:
                        self._tick(a, t)
                    elif self.open == 0:
                        break
                    else:
                        self.push(t + 1.0, TICK, a + 1)
        except KeyboardInterrupt:  # Ctrl-C: stop here; what ran is still summarised
            self.interrupted_at = t
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        return RunStats(wall, cpu, self.requests, self.decisions, self.events, rss)

    def _tick(self, n: int, t: float) -> None:
        sc = self.sc
        for view in self.views:  # replicas with no traffic still read their streams
            view.advance(t, self.logs)
        if n % 10 == 0:
            for view in self.views:  # regions a replica has not asked for: applied now, so
                view.catch_up_all()  # the logs can be trimmed
            for g, log in enumerate(self.logs):
                log.trim(min(v.cursors[g] for v in self.views))
        interval = max(1, round(sc.report_interval_s))
        if n % interval == 0:
            util: dict[str, list[float]] = {}
            for w, sw in enumerate(self.static):
                if self.up[w]:
                    running = self.engines[w].load(t)[0]
                    util.setdefault(sw.region, []).append(running / sw.max_running)
            self.metrics.close_interval(
                t, {r: sum(v) / len(v) for r, v in util.items()}, self.demand.rate_at(t)
            )
        if self.progress is not None:
            self.progress(t)
        self.push(t + 1.0, TICK, n + 1)

    # --- requests ------------------------------------------------------------------------

    def _arrive(self, req: Request, t: float) -> None:
        self.requests += 1
        self.open += 1
        self.metrics.arrival(req.tier.name.lower())
        self._route(req, t)
        nxt = self.demand.next_request()
        if nxt is not None:
            self.push(nxt.arrived, ARRIVE, nxt)

    def _route(self, req: Request, t: float) -> None:
        view = self.views[req.site]
        view.advance(t, self.logs)
        self.clock.now = t
        query = RouteQuery(
            request_id=str(req.rid),
            model=req.model,
            priority=req.tier,
            allowed_regions=req.allowed,
            edge_site=self.site_names[req.site],
            prompt_tokens=req.prompt + req.delivered,
            max_tokens=req.max_tokens,
            session_id=req.session,
            prefix_hashes=req.hashes,
            exclude_worker_ids=frozenset(req.tried),
        )
        m = self.metrics
        # Only sampled decisions are read, so only they are explained (same ranking either way).
        sampled = m.wants_sample()
        decision = self.schedulers[req.site].schedule_view(query, view, explain=sampled)
        self.decisions += 1
        req.routes += 1
        if sampled:
            m.sample(
                t,
                self.site_names[req.site],
                req.tier.name.lower(),
                decision.explanation,
                [(s.worker.worker_id, round(s.score, 3)) for s in decision.ranked],
            )
        if not decision.ranked:
            reason = decision.empty_reason.value if decision.empty_reason else "empty"
            m.refuse(req.tier.name.lower(), reason)
            self.open -= 1
            return
        req.ranked = [self.index[s.worker.worker_id] for s in decision.ranked]
        view.assign(req.ranked[0], req.rid)
        self._attempt(req, t + self.sc.router.route_s + self.sc.router.service_s)

    def _attempt(self, req: Request, t: float) -> None:
        w = req.ranked.pop(0)
        req.worker = w
        req.attempts += 1
        sw = self.static[w]
        req.tried.add(sw.worker_id)
        self.metrics.routed(t, sw.region)
        self.push(t + self.network.to_worker_s(req.site, sw.region_index), DELIVER, req, w)

    def _deliver(self, req: Request, w: int, t: float) -> None:
        sw = self.static[w]
        if not self.up[w]:
            if self.down_mode[w] == "partition":
                back = t + self.sc.router.connect_timeout_s
            else:
                back = t + self.network.one_way_s(req.site, sw.region_index)
            self.push(back, FAILBACK, req)
            return
        if req.allowed and sw.region not in req.allowed:
            self.metrics.residency_violations += 1
        limit = self.max_len[w]
        if req.prompt >= limit or req.prompt + req.max_tokens > limit:
            # As the worker's validation does (services/worker/sim/validation.py): a 400
            # (context_length_exceeded) the edge relays, no failover; the worker is fine.
            back = t + self.network.one_way_s(req.site, sw.region_index)
            self.views[req.site].later(back, OUTCOME, w, (req.rid, False))
            self.metrics.refuse(req.tier.name.lower(), "context_length_exceeded")
            self.open -= 1
            return
        job = Job(
            rid=req.rid,
            priority=int(req.tier),
            prompt=req.prompt + req.delivered,
            target=max(1, req.output - req.delivered),
            chain=req.chain,
            extend_key=req.extend_key,
            owner=req,
        )
        self.admitted[w].append(req.rid)
        self.admitted_by[w] |= 1 << req.site
        self._submit(w, job, t)

    def _submit(self, w: int, job: Job, t: float) -> None:
        eng = self.engines[w]
        before = eng.version
        eng.submit(job, t)
        if eng.version != before and eng.next_at < math.inf:
            self.push(eng.next_at, WAKE, w, eng.version)
        self._want_report(w, t)

    def _after_engine(self, w: int, t: float) -> None:
        eng = self.engines[w]
        if eng.next_at < math.inf:
            self.push(eng.next_at, WAKE, w, eng.version)
        self._want_report(w, t)

    def _failback(self, req: Request, t: float) -> None:
        w = req.worker
        self.views[req.site].later(t, OUTCOME, w, (req.rid, True))
        if req.attempts >= self.sc.router.max_attempts:
            self.metrics.refuse(req.tier.name.lower(), "failed")
            self.open -= 1
            return
        if req.ranked:
            self._attempt(req, t)
        else:
            self._route(req, t)

    def _emitter(self, w: int) -> Callable[[str, Job, float], None]:
        def emit(kind: str, job: Job, t: float) -> None:
            owner = job.owner
            if isinstance(owner, BackgroundStream):
                if kind == "done":
                    self._start_background(w, owner, t)
                return
            req = cast(Request, owner)
            sw = self.static[w]
            net = self.network
            if kind == "first":
                if req.first_at is None:
                    req.first_at = t + net.to_edge_s(req.site, sw.region_index, True)
                    ttft_ms = (req.first_at - req.arrived) * 1000.0
                    self.metrics.first_token(
                        self.site_names[req.site], sw.region, req.tier.name.lower(), ttft_ms
                    )
                    if self.records is not None:
                        self.records.append((ttft_ms, sw.region, req.rid))
                return
            edge_t = t + net.to_edge_s(req.site, sw.region_index, False)
            first = req.first_at if req.first_at is not None else edge_t
            itl = (edge_t - first) * 1000.0 / (req.output - 1) if req.output > 1 else None
            self.metrics.done(
                self.site_names[req.site], sw.region, req.tier.name.lower(),
                (first - req.arrived) * 1000.0, itl, (edge_t - req.arrived) * 1000.0,
            )  # fmt: skip
            self.views[req.site].later(edge_t, OUTCOME, w, (req.rid, False))
            self.demand.finished(req)
            self.open -= 1
            if self.last_load[w] >= self.sc.router.early_report_load:
                self._early_report(w, t)

        return emit

    def _start_background(self, w: int, bg: BackgroundStream, t: float) -> None:
        if not self.up[w]:
            return
        rid = next(self._bg_rid)
        if not bg.messages:
            bg.messages = (("user", f"background {self.static[w].worker_id} {-rid}"),)
        job = Job(rid=rid, priority=0, prompt=bg.prompt, target=bg.max_tokens, owner=bg)
        eng = self.engines[w]
        before = eng.version
        eng.submit(job, t)
        if eng.version != before and eng.next_at < math.inf:
            self.push(eng.next_at, WAKE, w, eng.version)

    # --- load reports --------------------------------------------------------------------

    def _want_report(self, w: int, t: float) -> None:
        if self.report_pending[w] or not self.up[w]:
            return
        T = self.sc.router.report_interval_s
        anchor = self.report_anchor[w]
        k = math.ceil((t - anchor) / T) if t > anchor else 0
        self.report_pending[w] = True
        self.report_version[w] += 1
        self.push(anchor + k * T, REPORT, w, self.report_version[w])

    def _early_report(self, w: int, t: float) -> None:
        self.report_pending[w] = True
        self.report_version[w] += 1
        self.push(t + EARLY_REPORT_S, REPORT, w, self.report_version[w])

    def _report(self, w: int, t: float) -> None:
        self.report_pending[w] = False
        self.report_anchor[w] = t
        if not self.up[w]:
            return
        eng = self.engines[w]
        running, waiting, kv, tps, hit, gpu = eng.load(t)
        last = self.last_report[w]
        admitted = self.admitted[w]
        models = self.models[w]
        band = self._deadband
        if band == 0.0:  # what the worker does today: every report carries the latest figures
            changed = (
                running != last.running or waiting != last.waiting or kv != last.kv
                or tps != last.tps or hit != last.hit_rate or gpu != last.gpu
                or models is not last.models
            )  # fmt: skip
        else:  # a proposed worker option: figures within the band are news to nobody
            changed = (
                running != last.running or waiting != last.waiting
                or models is not last.models or abs(kv - last.kv) >= band
                or abs(tps - last.tps) >= band * max(last.tps, 1.0)
                or abs(gpu - last.gpu) >= band or abs(hit - last.hit_rate) >= band
            )  # fmt: skip
        if changed or admitted:
            rep = _new_report(
                Report,
                (t, running, waiting, kv, tps, hit, gpu, models, False, tuple(admitted),
                 self.admitted_by[w]),
            )  # fmt: skip
            self.last_report[w] = rep
            if admitted:
                self.admitted[w] = []
                self.admitted_by[w] = 0
            self._publish(w, t, rep)
            load = (running + waiting) / self.static[w].max_running
            self.last_load[w] = load if load >= kv else kv
        if changed or eng.busy:
            self.report_pending[w] = True
            v = self.report_version[w] + 1
            self.report_version[w] = v
            heapq.heappush(self.heap, (t + self._report_interval_s, next(self.seq), REPORT, w, v))

    # --- faults --------------------------------------------------------------------------

    def _fault(self, ev: Event, phase: object, t: float) -> None:
        g = self.region_index.get(ev.region, -1)
        if ev.kind == "region-outage":
            for w, sw in enumerate(self.static):
                if sw.region_index == g:
                    if phase is True:
                        self._kill(w, t, ev.mode)
                    else:
                        self._revive(w, t)
        elif ev.kind == "worker-crash":
            if phase is True:
                victims = [
                    w for w, sw in enumerate(self.static) if sw.region_index == g and self.up[w]
                ]
                chosen = self.rng.sample(victims, min(ev.count, len(victims)))
                self._crashed = chosen
                for w in chosen:
                    self._kill(w, t, "crash")
            else:
                for w in getattr(self, "_crashed", []):
                    self._revive(w, t)
        elif ev.kind == "link-degraded":
            sites = [self.site_names.index(ev.site)] if ev.site else range(len(self.site_names))
            for si in sites:
                if phase is True:
                    self.network.degrade(si, g, ev.extra_rtt_ms, ev.loss)
                else:
                    self.network.restore(si, g)
                view = self.views[si]
                view.later(
                    t + self.sc.router.probe_delay_s,
                    LINK,
                    g,
                    (self.network.rtt_ms[si][g], self.network.loss[si][g]),
                )
        elif ev.kind == "model-rollout":
            regions = {self.region_index[r] for r in ev.regions}
            for w, sw in enumerate(self.static):
                if sw.region_index not in regions:
                    continue
                others = tuple(m for m in self.models[w] if m.name != ev.model)
                if phase is True:
                    status = ModelStatus(ev.model, ModelState.LOADING, 8192)
                elif phase == "ready":
                    status = ModelStatus(ev.model, ModelState.READY, 8192)
                else:
                    status = None
                self.models[w] = others + ((status,) if status is not None else ())
                self._early_report(w, t)

    def _kill(self, w: int, t: float, mode: str) -> None:
        if not self.up[w]:
            return
        self.up[w] = False
        self.down_mode[w] = mode
        self._publish(w, t, None)
        self.report_version[w] += 1
        self.report_pending[w] = False
        g = self.static[w].region_index
        stale = self.sc.router.stale_after_s
        for si, view in enumerate(self.views):
            owd = self.network.one_way_s(si, g)
            if mode == "partition":
                view.later(t + owd + stale, HEALTH, w, (False, f"no load report for {stale:.1f}s"))
            else:
                view.later(t + owd, HEALTH, w, (False, "disconnected: stream broke"))
        lost = self.engines[w].crash()
        for job in lost:
            owner = job.owner
            if isinstance(owner, BackgroundStream):
                continue
            req = cast(Request, owner)
            delay = (
                self.sc.router.connect_timeout_s
                if mode == "partition"
                else self.network.one_way_s(req.site, g)
            )
            if req.first_at is not None:  # streaming: resume elsewhere from what was delivered
                req.delivered += job.out
                req.resumed = True
                self.metrics.counts["resumed"] += 1
                req.attempts = 0
                req.ranked = []
            self.push(t + delay, FAILBACK, req)

    def _revive(self, w: int, t: float) -> None:
        if self.up[w]:
            return
        self.up[w] = True
        self.down_mode[w] = ""
        self._publish(w, t, None)
        g = self.static[w].region_index
        for si, view in enumerate(self.views):
            view.later(t + self.network.one_way_s(si, g), HEALTH, w, (True, "ok"))
        self.last_report[w] = Report(-1.0, -1, 0, 0.0, 0.0, 0.0, 0.0, self.models[w], False, ())
        self._early_report(w, t)
        for bg in self.sc.background:
            if self.region_index[bg.region] == g:
                for _ in range(bg.streams_per_worker):
                    self._start_background(
                        w, BackgroundStream(g, bg.prompt_tokens, bg.max_tokens), t
                    )
