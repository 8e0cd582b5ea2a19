"""The memoised half of a profile, kept up to date incrementally: the framework's answer to
"1,000 workers in CPython".

Running 8 filters and 8 scorers over 1,000 workers is 16,000 Python-level evaluations per
decision (milliseconds). But snapshots are immutable, and the registry hands in the same list
of workers, in the same order, with the same snapshot *objects* for every worker whose state
did not change since the last decision (typically only the worker picked last time, whose
in-flight count went up, plus those that sent a load report or answered a probe).

So, for each *query class* — the tuple of query keys the :class:`WorkerFilter`\\ s and
:class:`WorkerScorer`\\ s depend on (model, priority tier, allowed regions...) — a
:class:`ClassView` keeps arrays aligned with the last worker list: each worker's verdict, each
scorer's raw score, the weighted sum, and the compacted candidate list and totals the picker
needs. A decision then costs:

1. one C-level pass comparing the new list with the last one by identity
   (``compress(range(n), map(is_not, new, old))``);
2. one batch call per plugin over the changed workers only, and patching their positions;
3. a copy of the candidates' totals (which sparse scorers then adjust).

A view is rebuilt from scratch when the worker list changes length, or for a class not seen
before (or evicted: at most ``max_classes`` are kept, least recently used first). The view
holds the snapshots it was built from, so identity comparison is sound: a snapshot cannot be
freed, and its id reused, while a view refers to it.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from itertools import accumulate, compress, repeat
from time import perf_counter_ns
from typing import Any

from services.router.scheduling.plugin import WorkerFilter, WorkerScorer
from services.router.scheduling.types import (
    Contribution,
    NoCandidate,
    Rejection,
    RouteQuery,
    WorkerSnapshot,
)

_WORKER_ID = operator.attrgetter("worker_id")
_IS_NOT = operator.is_not
_IS = operator.is_
_NOT = operator.not_

Timings = dict[str, int]


class ClassView:
    """What the memoised plugins concluded about the current worker list, for one query class.

    Arrays indexed by input position: ``workers``, ``verdicts`` (``None`` = kept), ``raw[k]``
    (scorer k's unclamped score; 0 for rejected workers), ``static`` (Σ clamped score * share).
    Compacted, in input order: ``positions`` (input index of each candidate), ``candidates``,
    ``totals``, and ``rejected`` (the rejections, as a tuple).

    Read-only for callers; valid until the next decision of the same class.
    """

    __slots__ = (
        "candidates",
        "contributions",
        "empty",
        "index_cache",
        "keys",
        "positions",
        "raw",
        "rejected",
        "slot_of",
        "static",
        "totals",
        "verdicts",
        "workers",
    )

    def __init__(self, keys: tuple[Hashable, ...], n_scorers: int) -> None:
        self.keys = keys
        self.workers: list[WorkerSnapshot] = []
        self.verdicts: list[Rejection | None] = []
        self.raw: list[list[float]] = [[] for _ in range(n_scorers)]
        self.static: list[float] = []
        self.positions: list[int] = []
        self.slot_of: list[int] = []  # input index → index in candidates, or -1
        self.candidates: list[WorkerSnapshot] = []
        self.totals: list[float] = []
        self.rejected: tuple[Rejection, ...] = ()
        self.index_cache: dict[str, int] | None = None
        # input position → (snapshot, contributions of the memoised scorers), for ranked workers
        self.contributions: dict[int, tuple[WorkerSnapshot, tuple[Contribution, ...]]] = {}
        # (rejected, reason, retry, explanation) of the last empty decision, while it holds
        self.empty: tuple[tuple[Rejection, ...], NoCandidate, float | None, str] | None = None

    def index(self) -> dict[str, int]:
        """Worker id → position in ``candidates`` (built on first use after a re-layout)."""
        if self.index_cache is None:
            ids = map(_WORKER_ID, self.candidates)
            self.index_cache = dict(zip(ids, range(len(self.candidates)), strict=False))
        return self.index_cache


class Incremental:
    """Evaluates a profile's WorkerFilters (in order) and WorkerScorers (weighted) over a
    worker list, incrementally per query class. Not thread-safe."""

    __slots__ = ("_filters", "_max_classes", "_scorers", "_views")

    def __init__(
        self,
        filters: Sequence[WorkerFilter[Any]],
        scorers: Sequence[tuple[WorkerScorer[Any], float]],
        max_classes: int = 64,
    ) -> None:
        if max_classes < 1:
            raise ValueError("max_classes must be >= 1")
        self._filters = tuple(filters)
        self._scorers = tuple(scorers)  # (scorer, weight / Σ weights)
        self._max_classes = max_classes
        self._views: OrderedDict[tuple[Hashable, ...], ClassView] = OrderedDict()

    def scorer_keys(self, view: ClassView) -> tuple[Hashable, ...]:
        return view.keys[len(self._filters) :]

    def view(self, query: RouteQuery, workers: Sequence[WorkerSnapshot], ns: Timings) -> ClassView:
        keys = tuple(
            [f.key(query) for f in self._filters] + [s.key(query) for s, _ in self._scorers]
        )
        views = self._views
        view = views.get(keys)
        n = len(workers)
        if view is None or len(view.workers) != n:
            view = ClassView(keys, len(self._scorers))
            views[keys] = view
            if len(views) > self._max_classes:
                views.popitem(last=False)
            self._rebuild(view, list(workers), ns)
            return view
        views.move_to_end(keys)
        changed = list(compress(range(n), map(_IS_NOT, workers, view.workers)))
        if len(changed) * 2 > n:
            self._rebuild(view, list(workers), ns)
        elif changed:
            self._patch(view, workers, changed, ns)
        return view

    # --- evaluation ---------------------------------------------------------------------

    def _evaluate(
        self, view: ClassView, batch: list[WorkerSnapshot], ns: Timings
    ) -> tuple[list[Rejection | None], list[list[float]], list[float]]:
        """Verdicts, raw scores and weighted sums for a batch (one call per plugin).

        Scorers score the whole batch, rejected workers included: cheaper than scattering the
        survivors' scores back into place, and a rejected worker's score is never used.
        """
        keys = view.keys
        size = len(batch)
        verdicts: list[Rejection | None] = [None] * size
        pending: list[int] | None = None  # batch indices still kept; None: all of them
        subset = batch
        for f, key in zip(self._filters, keys, strict=False):
            if not subset:
                break
            t0 = perf_counter_ns()
            reasons = f.reject(subset, key)
            ns[f.TYPE] += perf_counter_ns() - t0
            _check(f.TYPE, reasons, subset)
            if reasons.count(None) == len(subset):
                continue
            indices = range(size) if pending is None else pending
            still: list[int] = []
            for j, w, reason in zip(indices, subset, reasons, strict=False):
                if reason is None:
                    still.append(j)
                else:
                    verdicts[j] = Rejection(w.worker_id, w.region, f.TYPE, reason)
            pending = still
            subset = [batch[j] for j in still]
        raw: list[list[float]] = []
        sums = [0.0] * size
        for (s, share), key in zip(self._scorers, keys[len(self._filters) :], strict=False):
            t0 = perf_counter_ns()
            values = s.scores(batch, key)
            ns[s.TYPE] += perf_counter_ns() - t0
            _check(s.TYPE, values, batch)
            # The framework's clamp (see framework.clamp), inlined: NaN and below 0 → 0.
            sums = [
                acc + (0.0 if not v > 0.0 else share if v > 1.0 else v * share)
                for acc, v in zip(sums, values, strict=False)
            ]
            raw.append(values)
        return verdicts, raw, sums

    def _rebuild(self, view: ClassView, workers: list[WorkerSnapshot], ns: Timings) -> None:
        verdicts, raw, static = self._evaluate(view, workers, ns)
        view.workers = workers
        view.verdicts = verdicts
        view.raw = raw
        view.static = static
        self._compact(view)
        view.rejected = tuple(compress(verdicts, map(_IS_NOT, verdicts, repeat(None))))  # type: ignore[arg-type]

    def _compact(self, view: ClassView) -> None:
        keep = list(map(_IS, view.verdicts, repeat(None)))
        view.positions = list(compress(range(len(keep)), keep))
        view.candidates = list(compress(view.workers, keep))
        view.totals = list(compress(view.static, keep))
        # Running count of kept workers: a kept worker's slot (meaningless for the others).
        view.slot_of = list(accumulate(keep, initial=-1))[1:]
        view.index_cache = None

    def _patch(
        self,
        view: ClassView,
        workers: Sequence[WorkerSnapshot],
        changed: list[int],
        ns: Timings,
    ) -> None:
        batch = [workers[i] for i in changed]
        verdicts, raw, static = self._evaluate(view, batch, ns)
        layout_changed = False
        rejections_changed = False
        slot_of = view.slot_of
        for j, i in enumerate(changed):
            old = view.verdicts[i]
            new = verdicts[j]
            if view.workers[i].worker_id != batch[j].worker_id:
                layout_changed = True  # a different worker at this position: re-index
            view.workers[i] = batch[j]
            view.verdicts[i] = new
            view.static[i] = static[j]
            if old is not None or new is not None:
                rejections_changed = True
                layout_changed = layout_changed or (old is None) != (new is None)
            if new is None and not layout_changed:
                c = slot_of[i]
                view.candidates[c] = batch[j]
                view.totals[c] = static[j]
        for k, values in enumerate(raw):
            column = view.raw[k]
            for j, i in enumerate(changed):
                column[i] = values[j]
        if layout_changed:
            self._compact(view)
        if rejections_changed:
            vs = view.verdicts
            view.rejected = tuple(compress(vs, map(_IS_NOT, vs, repeat(None))))  # type: ignore[arg-type]


def _check(plugin: str, answers: Sequence[object], batch: Sequence[WorkerSnapshot]) -> None:
    """A plugin must answer once per worker (checked once, so the loops can zip freely)."""
    if len(answers) != len(batch):
        raise RuntimeError(
            f"plugin '{plugin}' answered {len(answers)} times for {len(batch)} workers"
        )
