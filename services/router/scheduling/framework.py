"""The scheduler: filters → scorers → picker, and the rules only the framework applies.

    decision = pick(rank(Σ_i clamp(score_i) · w_i / Σw, over filter(workers)))

The framework owns, in one place (GIE's ``scheduler_profile.go`` / ``weighted_scorer.go``):

- clamping every score to [0, 1] (NaN → 0) and weighting it (a scorer never sees its weight);
- the per-candidate contributions (score, weight, weighted share, raw detail) of the ranked
  workers, the rejections (which filter removed whom, and why), a one-line explanation, and the
  classification of an empty decision (``explain.py``);
- timing every plugin call (``time.perf_counter_ns``), reported in microseconds per plugin type,
  plus ``explain`` (contributions, details and the explanation line), ``framework`` (the rest)
  and ``total``; a memoised plugin that had nothing new to evaluate reports 0;
- the random source for tie-breaking (seedable for tests).

Order of evaluation. :class:`WorkerFilter`\\ s and :class:`WorkerScorer`\\ s are evaluated
incrementally (``incremental.py``: only workers whose snapshot changed since the last decision
of the same query class are recomputed). Filters run in profile order, the memoised ones first,
then the plain :class:`Filter`\\ s (``exclude``) over the survivors, so a worker rejected by
several filters is reported once, by the first that saw it. Plain scorers (affinity, sparse)
then adjust the totals, the picker ranks, and contributions and the explanation are built for
the ranked few only.

Not thread-safe: one scheduler per event loop (plugins such as affinity hold state).
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from time import perf_counter_ns
from typing import Any, NamedTuple

from services.router.scheduling.explain import classify_empty, explain_empty, explain_winner
from services.router.scheduling.incremental import ClassMemo, Incremental, Timings
from services.router.scheduling.plugin import (
    Candidates,
    Filter,
    Picker,
    Plugin,
    PostPick,
    Scored,
    Scorer,
    WorkerFilter,
    WorkerScorer,
)
from services.router.scheduling.regional import RegionalView, RegionStage, schedule_regions
from services.router.scheduling.types import (
    Contribution,
    Decision,
    Rejection,
    RouteQuery,
    ScoredWorker,
    WorkerSnapshot,
)


def clamp(value: float) -> float:
    """A score in [0, 1]; NaN counts as 0 (a broken signal must not win)."""
    if not value > 0.0:
        return 0.0
    return 1.0 if value > 1.0 else value


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    """A scorer and the weight a profile gives it (> 0; a scorer without one is an error)."""

    scorer: Scorer
    weight: float

    def __post_init__(self) -> None:
        if isinstance(self.weight, bool) or not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"scorer '{self.scorer.TYPE}': weight must be > 0")


_EXPLAIN = "explain"  # timing bucket: contributions, details and the explanation line


class _Kept(NamedTuple):
    """The filter step's result: survivors, their positions in the memo, their memoised
    score sums, and every rejection so far."""

    workers: Sequence[WorkerSnapshot]
    positions: Sequence[int]
    base: Sequence[float]
    rejected: tuple[Rejection, ...]

    def keeping(self, survivors: Sequence[WorkerSnapshot], removed: tuple[Rejection, ...]) -> _Kept:
        alive = set(map(id, survivors))
        keep = list(map(alive.__contains__, map(id, self.workers)))
        return _Kept(
            list(compress(self.workers, keep)),
            list(compress(self.positions, keep)),
            list(compress(self.base, keep)),
            self.rejected + removed,
        )


class _Scores(NamedTuple):
    """The score step's result: candidates and their weighted totals."""

    candidates: Candidates
    totals: list[float]
    plain: list[Mapping[str, float]]  # each plain scorer's raw scores, for contributions
    boosts: dict[int, float]  # candidate → what the sparse plain scorers added to its total
    whole: bool  # no plain filter removed anyone: the memo's indices and shortlist hold


class SchedulerProfile:
    """One profile, ready to decide: ``schedule(query, workers) -> Decision``."""

    def __init__(
        self,
        *,
        filters: Sequence[Filter],
        scorers: Sequence[WeightedScorer],
        picker: Picker,
        name: str = "default",
        rng: random.Random | None = None,
        unavailable_retry_after_s: float | None = 1.0,
        max_query_classes: int = 64,
        regions: RegionStage | None = None,
    ) -> None:
        seen: set[str] = set()
        plugins: list[Plugin] = [*filters, *(s.scorer for s in scorers), picker]
        for p in plugins:
            if p.TYPE in seen:
                raise ValueError(f"plugin '{p.TYPE}' appears twice in profile '{name}'")
            seen.add(p.TYPE)
        if unavailable_retry_after_s is not None and not unavailable_retry_after_s >= 0:
            raise ValueError("unavailable_retry_after_s must be >= 0")
        self.name = name
        #: region pre-selection (``regional.py``), or None: every decision sees the whole fleet
        self.regions = regions
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker
        self._rng = rng if rng is not None else random.Random()
        self._unavailable_retry_after_s = unavailable_retry_after_s
        total_weight = math.fsum(s.weight for s in scorers)
        memo_scorers: list[tuple[WorkerScorer[Any], float]] = []
        self._plain_scorers: list[tuple[Scorer, float]] = []
        memo_slots: list[tuple[int, WorkerScorer[Any], float, float]] = []
        plain_slots: list[tuple[int, Scorer, float, float]] = []
        memo_at: list[int] = []  # profile positions of the memoised scorers
        plain_at: list[int] = []  # and of the plain ones
        for at, ws in enumerate(scorers):
            share = ws.weight / total_weight
            if isinstance(ws.scorer, WorkerScorer):
                memo_slots.append((len(memo_scorers), ws.scorer, ws.weight, share))
                memo_scorers.append((ws.scorer, share))
                memo_at.append(at)
            else:
                plain_slots.append((len(self._plain_scorers), ws.scorer, ws.weight, share))
                self._plain_scorers.append((ws.scorer, share))
                plain_at.append(at)
        self._memo_slots = tuple(memo_slots)
        self._plain_slots = tuple(plain_slots)
        # Contributions are built memoised-first; this permutation restores profile order.
        grouped = memo_at + plain_at
        self._profile_order: tuple[int, ...] | None = None
        if grouped != sorted(grouped):
            self._profile_order = tuple(grouped.index(j) for j in range(len(grouped)))
        self._plain_filters = tuple(f for f in filters if not isinstance(f, WorkerFilter))
        self._incremental = Incremental(
            [f for f in filters if isinstance(f, WorkerFilter)], memo_scorers, max_query_classes
        )
        self._hooks = tuple((p.TYPE, p) for p in plugins if isinstance(p, PostPick))
        self._plugin_types = (*(p.TYPE for p in plugins), _EXPLAIN)

    @property
    def rng(self) -> random.Random:
        """The profile's random source (tie-breaks), shared with the region stage."""
        return self._rng

    def schedule_view(
        self, query: RouteQuery, view: RegionalView, *, explain: bool = True
    ) -> Decision:
        """Decide over a fleet that answers per region: through the profile's region
        pre-selection when it has one (``regional.py``), else over every worker."""
        if self.regions is None:
            return self.schedule(query, view.all_rows(), explain=explain)
        return schedule_regions(self, self.regions, query, view, explain=explain)

    def schedule(
        self,
        query: RouteQuery,
        workers: Sequence[WorkerSnapshot],
        *,
        scope: Hashable = None,
        explain: bool = True,
    ) -> Decision:
        """Rank the workers for this query: filter → score → pick → explain, as the module
        docstring's formula reads. Pure, apart from the memo and the state of post-pick
        plugins (affinity). ``scope`` names which part of the fleet ``workers`` is (the
        region stage's chosen regions), so each part keeps its own incremental memo.

        ``explain=False``: the same ranking, without what only a reader of the decision needs
        (per-signal contributions, the winner line): for callers that look at a sample of
        decisions only (the planet simulator), where building them was a fifth of a
        decision's cost. Empty decisions are always explained (their reason is the answer)."""
        started = perf_counter_ns()
        ns: Timings = dict.fromkeys(self._plugin_types, 0)
        memo = self._incremental.view(query, workers, ns, scope)
        kept = self._filter(query, memo, ns)
        if not kept.workers:
            return self._empty(query, workers, memo, kept.rejected, ns, started)
        scores = self._score(query, memo, kept, ns)
        order = self._pick(query, memo, scores, ns)
        if explain:
            decision = self._explain(query, order, memo, kept, scores, ns)
        else:
            candidates, totals = scores.candidates, scores.totals
            decision = Decision(
                ranked=tuple([ScoredWorker(candidates[i], totals[i]) for i in order]),
                rejected=kept.rejected,
                plugin_timings_us={},
            )
        for type_name, hook in self._hooks:
            t0 = perf_counter_ns()
            hook.observe(query, decision)
            ns[type_name] += perf_counter_ns() - t0
        self._finish_timings(decision.plugin_timings_us, ns, started)
        return decision

    def _filter(self, query: RouteQuery, memo: ClassMemo, ns: Timings) -> _Kept:
        """The memo's survivors (memoised filters ran in ``view``), then the plain filters
        over those survivors, in profile order."""
        kept = _Kept(memo.candidates, memo.positions, memo.totals, memo.rejected)
        for f in self._plain_filters:
            if not kept.workers:
                break
            t0 = perf_counter_ns()
            survivors, removed = f.filter(query, kept.workers)
            ns[f.TYPE] += perf_counter_ns() - t0
            if removed or len(survivors) != len(kept.workers):
                kept = kept.keeping(survivors, tuple(removed))
        return kept

    def _score(self, query: RouteQuery, memo: ClassMemo, kept: _Kept, ns: Timings) -> _Scores:
        """Weighted totals: the memo's memoised-scorer sums plus each plain scorer's
        ``clamp(score) · w / Σw``."""
        # While no plain filter removed anyone, the memo's indices still hold: scorers and
        # the picker may use its lookups and shortlist.
        whole = kept.workers is memo.candidates
        candidates = (
            Candidates(kept.workers, memo.find, memo.nearest_rtt_ms)
            if whole
            else Candidates(kept.workers)
        )
        totals = list(kept.base)  # the memo's copy stays untouched; sparse scorers add here
        plain_scores: list[Mapping[str, float]] = []
        boosts: dict[int, float] = {}
        for scorer, share in self._plain_scorers:
            t0 = perf_counter_ns()
            raw = scorer.score(query, candidates)
            ns[scorer.TYPE] += perf_counter_ns() - t0
            plain_scores.append(raw)
            for worker_id, value in raw.items():
                i = candidates.index_of(worker_id)
                if i is not None:
                    boost = clamp(value) * share
                    totals[i] += boost
                    boosts[i] = boosts.get(i, 0.0) + boost
        return _Scores(candidates, totals, plain_scores, boosts, whole)

    def _pick(
        self, query: RouteQuery, memo: ClassMemo, scores: _Scores, ns: Timings
    ) -> Sequence[int]:
        """The picker's ranked indices, checked (each once, each in range)."""

        def hint() -> tuple[Collection[int], int] | None:
            found = memo.shortlist()
            if found is None or not scores.boosts:
                return found
            return found[0].union(scores.boosts), found[1]  # a boost may lift anyone to the top

        t0 = perf_counter_ns()
        scored = Scored(
            scores.candidates,
            scores.totals,
            self._rng,
            hint if scores.whole else None,
            scores.boosts,
        )
        order = self.picker.pick(query, scored)
        ns[self.picker.TYPE] += perf_counter_ns() - t0
        n = len(scores.candidates)
        # each index once and in range (min/max: two C calls, not a generator per decision)
        if len(set(order)) != len(order) or (order and (min(order) < 0 or max(order) >= n)):
            raise RuntimeError(f"picker '{self.picker.TYPE}' returned invalid indices {order}")
        return order

    def _explain(
        self,
        query: RouteQuery,
        order: Sequence[int],
        memo: ClassMemo,
        kept: _Kept,
        scores: _Scores,
        ns: Timings,
    ) -> Decision:
        """The decision: ranked workers with per-signal contributions and a one-line
        explanation (timed as ``explain``)."""
        t0 = perf_counter_ns()
        ranked = self._ranked(
            query, order, scores.candidates, kept.positions, scores.totals, memo, scores.plain
        )
        explanation = explain_winner(ranked, len(scores.candidates), len(kept.rejected))
        ns[_EXPLAIN] += perf_counter_ns() - t0
        return Decision(
            ranked=ranked, rejected=kept.rejected, explanation=explanation, plugin_timings_us={}
        )

    def _ranked(
        self,
        query: RouteQuery,
        order: Sequence[int],
        candidates: Candidates,
        positions: Sequence[int],
        totals: Sequence[float],
        view: ClassMemo,
        plain_scores: list[Mapping[str, float]],
    ) -> tuple[ScoredWorker, ...]:
        """The ranked workers with their contributions, in profile order.

        Contributions of memoised scorers depend on the snapshot alone, so they are kept per
        worker position in the view and rebuilt only when that worker's snapshot changed (the
        fallbacks of one decision are often the fallbacks of the next).
        """
        keys = self._incremental.scorer_keys(view)
        raw = view.raw
        cache = view.contributions
        out: list[ScoredWorker] = []
        for i in order:
            w = candidates[i]
            p = positions[i]
            entry = cache.get(p)
            if entry is not None and entry[0] is w:
                memo = entry[1]
            else:
                memo = tuple(
                    [
                        Contribution(s.TYPE, c, weight, c * share, s.describe(w, keys[k]))
                        for k, s, weight, share in self._memo_slots
                        for c in (clamp(raw[k][p]),)
                    ]
                )
                cache[p] = (w, memo)
            if self._plain_slots:
                plain = tuple(
                    [
                        Contribution(s.TYPE, c, weight, c * share, s.detail(query, w))
                        for k, s, weight, share in self._plain_slots
                        for c in (clamp(plain_scores[k].get(w.worker_id, 0.0)),)
                    ]
                )
                merged = memo + plain
                if self._profile_order is not None:
                    merged = tuple([merged[j] for j in self._profile_order])
            else:
                merged = memo
            out.append(ScoredWorker(worker=w, score=totals[i], contributions=merged))
        return tuple(out)

    def _empty(
        self,
        query: RouteQuery,
        workers: Sequence[WorkerSnapshot],
        view: ClassMemo,
        rejected: tuple[Rejection, ...],
        ns: Timings,
        started: int,
    ) -> Decision:
        """An empty decision, classified and explained. Under overload every decision of a
        class can be empty; while the class's rejections stay the same (no worker changed:
        every worker is among them), the verdict is reused instead of rescanning them."""
        t0 = perf_counter_ns()
        cached = view.empty
        if cached is not None and cached[0] is rejected and not query.exclude_worker_ids:
            _, reason, retry, explanation = cached
        else:
            reason, retry = classify_empty(
                query, workers, rejected, self.filters, self._unavailable_retry_after_s
            )
            explanation = explain_empty(query, reason, rejected)
            if rejected is view.rejected and not query.exclude_worker_ids:
                view.empty = (rejected, reason, retry, explanation)
        ns[_EXPLAIN] += perf_counter_ns() - t0
        decision = Decision(
            ranked=(),
            rejected=rejected,
            explanation=explanation,
            empty_reason=reason,
            retry_after_s=retry,
            plugin_timings_us={},
        )
        self._finish_timings(decision.plugin_timings_us, ns, started)
        return decision

    @staticmethod
    def _finish_timings(out: dict[str, float], ns: Timings, started: int) -> None:
        total = perf_counter_ns() - started
        out.update({name: spent / 1000 for name, spent in ns.items()})
        out["framework"] = (total - sum(ns.values())) / 1000
        out["total"] = total / 1000
