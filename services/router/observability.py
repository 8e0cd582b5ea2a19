"""The router's traces and metrics.

- A SERVER span ``router.Route`` per decision, child of the edge's ``edge.route`` span (the
  context travels in gRPC metadata). Attributes: the winner, the runners-up, the winner's
  per-signal contributions (``meridian.score.<signal>``), the signal that decided, the cost.
- ``meridian.router.decisions{meridian.region, meridian.signal}``: decisions by the region
  that won and by the signal that separated it most from the runner-up;
  ``meridian.router.empty_decisions{meridian.reason}``; decision and per-plugin cost in µs;
  healthy workers by region (a gauge read from the fleet at scrape time).

Cost. ``record`` runs on every decision, so it does the least the metrics need: the two
decision counters are plain dict counts read at collection time (observable counters: the
same cumulative series, without the SDK's per-call attribute hashing), the decision cost is one
histogram record, and the per-plugin costs (twenty-odd plugins, one histogram record each:
more than the decision itself) are recorded for one decision in ``plugin_sample_every`` — the
first one always. 64: a record costs ~5–8 µs (the SDK's measurement, attribute hash and
lock), so one in 16 still spent ~10 µs per decision on them, twice the decision histogram;
at 200 decisions/s one in 64 is ~3 samples of every plugin per second, enough for the
dashboards' per-minute percentiles. Every decision's per-plugin timings stay in the journal's
:class:`~services.router.journal.PluginTimings` (the debug endpoint), unsampled.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Mapping

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeter, Observation

from services.common import metric_names as mn
from services.router.scheduling.types import Decision, ScoredWorker, WorkerSnapshot


def deciding_signal(decision: Decision) -> str:
    """The signal whose weighted contribution put the winner furthest ahead of the runner-up
    (or the winner's largest contribution when it stood alone)."""
    if not decision.ranked:
        return ""
    winner = decision.ranked[0]
    if not winner.contributions:
        return "none"
    runner: Mapping[str, float] = {}
    if len(decision.ranked) > 1:
        runner = {c.signal: c.weighted for c in decision.ranked[1].contributions}
    best = max(winner.contributions, key=lambda c: c.weighted - runner.get(c.signal, 0.0))
    return best.signal


def _label(scored: ScoredWorker) -> str:
    return f"{scored.worker.worker_id}@{scored.worker.region}:{scored.score:.3f}"


class RouterTelemetry:
    def __init__(
        self,
        *,
        tracer: trace.Tracer | None = None,
        meter: Meter | None = None,
        snapshots: Callable[[], Iterable[WorkerSnapshot]] | None = None,
        plugin_sample_every: int = 64,
    ) -> None:
        if plugin_sample_every < 1:
            raise ValueError("plugin_sample_every must be >= 1")
        self.tracer = tracer or trace.NoOpTracer()
        meter = meter or NoOpMeter("meridian.router")
        self._snapshots = snapshots or (lambda: ())
        self._plugin_sample_every = plugin_sample_every
        self._recorded = itertools.count()
        # (region, signal) → decisions; reason → empty decisions: read at collection time.
        self._decided: collections.Counter[tuple[str, str]] = collections.Counter()
        self._empty: collections.Counter[str] = collections.Counter()
        #: reason → outcome reports refused as malformed (RouteStream drops them: the stream
        #: and its other outcomes go on).
        self.refused_outcomes: collections.Counter[str] = collections.Counter()
        meter.create_observable_counter(
            mn.ROUTER_OUTCOMES_REFUSED,
            callbacks=[self._observe_refused],
            unit="{report}",
            description="Outcome reports refused as malformed, by reason",
        )
        meter.create_observable_counter(
            mn.ROUTER_DECISIONS,
            callbacks=[self._observe_decisions],
            unit="{decision}",
            description="Decisions by region and signal",
        )
        meter.create_observable_counter(
            mn.ROUTER_EMPTY,
            callbacks=[self._observe_empty],
            unit="{decision}",
            description="Requests no worker could take",
        )
        self.decision_us = meter.create_histogram(
            mn.ROUTER_DECISION_DURATION, unit="us", description="Cost of one Route decision"
        )
        self.plugin_us = meter.create_histogram(
            mn.ROUTER_PLUGIN_DURATION, unit="us", description="Cost of each plugin per decision"
        )
        meter.create_observable_gauge(
            mn.ROUTER_WORKERS,
            callbacks=[self._observe_workers],
            unit="{worker}",
            description="Healthy workers in this router's view, by region",
        )

    def _observe_workers(self, options: CallbackOptions) -> Iterable[Observation]:
        healthy: dict[str, int] = {}
        for w in self._snapshots():
            healthy.setdefault(w.region, 0)
            if w.healthy:
                healthy[w.region] += 1
        return [Observation(n, {mn.REGION: r}) for r, n in sorted(healthy.items())]

    def _observe_decisions(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {mn.REGION: region, mn.SIGNAL: signal})
            for (region, signal), n in list(self._decided.items())
        ]

    def _observe_refused(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {mn.REASON: reason}) for reason, n in list(self.refused_outcomes.items())
        ]

    def _observe_empty(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {mn.REASON: reason}) for reason, n in list(self._empty.items())]

    def record(self, decision: Decision, elapsed_us: float, span: trace.Span) -> None:
        """Metrics and span attributes for one decision (empty or not)."""
        self.decision_us.record(elapsed_us)
        if next(self._recorded) % self._plugin_sample_every == 0:
            for plugin, us in decision.plugin_timings_us.items():
                self.plugin_us.record(us, {mn.PLUGIN: plugin})
        recording = span.is_recording()
        if recording:
            span.set_attribute("meridian.decision_us", round(elapsed_us, 1))
            span.set_attribute("meridian.filtered", len(decision.rejected))
        if not decision.ranked:
            reason = decision.empty_reason.value if decision.empty_reason else "unavailable"
            self._empty[reason] += 1
            if recording:
                span.set_attribute("meridian.empty_reason", reason)
            return
        winner = decision.ranked[0]
        signal = deciding_signal(decision)
        self._decided[(winner.worker.region, signal)] += 1
        if recording:
            span.set_attribute(mn.WORKER, winner.worker.worker_id)
            span.set_attribute(mn.REGION, winner.worker.region)
            span.set_attribute("meridian.score", round(winner.score, 4))
            span.set_attribute(mn.SIGNAL, signal)
            span.set_attribute("meridian.runners_up", [_label(s) for s in decision.ranked[1:4]])
            for c in winner.contributions:
                span.set_attribute(f"meridian.score.{c.signal}", round(c.weighted, 4))
            span.set_attribute("meridian.explanation", decision.explanation)
