"""The memoised half of a profile, kept up to date incrementally: the framework's answer to
"1,000 workers in CPython".

Running 8 filters and 8 scorers over 1,000 workers is 16,000 Python-level evaluations per
decision (milliseconds). But snapshots are immutable, and the fleet hands in the same list
of workers, in the same order, with the same snapshot *objects* for every worker whose state
did not change since the last decision (typically only the worker picked last time, whose
in-flight count went up, plus those that sent a load report or answered a probe).

So, for each *query class* — the tuple of query keys the :class:`WorkerFilter`\\ s and
:class:`WorkerScorer`\\ s depend on (model, priority tier, allowed regions...) — a
:class:`ClassMemo` keeps arrays aligned with the last worker list: each worker's verdict, each
scorer's raw score, the weighted sum, and the compacted candidate list and totals the picker
needs. A decision then costs:

1. one C-level pass comparing the new list with the last one by identity
   (``compress(range(n), map(is_not, new, old))``);
2. one batch call per plugin over the changed workers only, and patching their positions
   (plus a re-compaction, a few C-level passes, when a worker's verdict flipped);
3. a copy of the candidates' totals (which sparse scorers then adjust);
4. ranking a *shortlist* instead of all totals: the view keeps the set of workers scoring at
   least a floor (the 32nd best total when the set was built), adds any candidate that climbs
   to the floor, and counts how many kept members are still at or above it (``depth``): the
   best ``depth`` candidates, and every candidate tied with them, are in the set. It is
   rebuilt (one pass) when ``depth`` falls below 8 or the set grows past 128.

The shortlist and the worker-id index are keyed by input position, which a verdict flip does
not move, so they survive re-compaction.

A view is rebuilt from scratch when the worker list changes length, for a class not seen
before (or evicted: at most ``max_classes`` are kept, least recently used first), or when more
than half of the workers changed. The view holds the snapshots it was built from, so identity
comparison is sound: a snapshot cannot be freed, and its id reused, while a view refers to it.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from itertools import accumulate, compress, repeat
from time import perf_counter_ns
from typing import Any

from services.router.scheduling.plugin import (
    UNSET,
    Unset,
    WorkerFilter,
    WorkerScorer,
    nearest_rtt_ms,
)
from services.router.scheduling.ranking import kth_largest
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
_LE = operator.le
_SHORTLIST = 32  # members of a fresh shortlist (more on ties)
_MIN_DEPTH = 8  # rebuild it when fewer kept members than this are known to be at the top
_MAX_SHORTLIST = 4 * _SHORTLIST  # or when climbers have made it this long

Timings = dict[str, int]
_BLOCK = 64  # changed_positions compares lists this many snapshots at a time


def changed_positions(new: Sequence[WorkerSnapshot], old: list[WorkerSnapshot]) -> list[int]:
    """Positions whose snapshot is not the object the view holds.

    A scan with ``is not`` costs ~35 ns a worker (350 µs at 10,000: most of a warm decision).
    Comparing 64-snapshot slices with ``==`` first costs ~3 ns a worker for identical slices
    (list equality checks identity before calling ``__eq__``), and only slices that differ are
    scanned. A new snapshot *equal* to the old one is reported unchanged, which is sound: plugins
    are pure functions of a snapshot's fields, and the view keeps the old, equal object.
    """
    n = len(new)
    if n <= 4 * _BLOCK or not isinstance(new, list):
        return list(compress(range(n), map(_IS_NOT, new, old)))
    out: list[int] = []
    for lo in range(0, n, _BLOCK):
        a = new[lo : lo + _BLOCK]
        b = old[lo : lo + _BLOCK]
        if a != b:
            out.extend(compress(range(lo, lo + len(a)), map(_IS_NOT, a, b)))
    return out


class ClassMemo:
    """What the memoised plugins concluded about the current worker list, for one query class.

    Indexed by input position: ``workers``, ``verdicts`` (``None`` = kept), ``raw[k]`` (scorer
    k's unclamped score), ``static`` (Σ clamped score * share), ``slot_of`` (the worker's index
    among the candidates; meaningless for rejected workers).
    Compacted, in input order: ``positions`` (input index of each candidate), ``candidates``,
    ``totals``; and ``rejected`` (the rejections, as a tuple).

    Read-only for callers; valid until the next decision of the same class.
    """

    __slots__ = (
        "candidates",
        "contributions",
        "crowded",
        "depth",
        "empty",
        "floor",
        "keys",
        "nearest",
        "pos_of",
        "positions",
        "raw",
        "rejected",
        "short",
        "slot_of",
        "static",
        "totals",
        "verdicts",
        "workers",
    )

    def __init__(self, keys: tuple[Hashable, ...]) -> None:
        self.keys = keys
        self.workers: list[WorkerSnapshot] = []
        self.verdicts: list[Rejection | None] = []
        self.raw: list[list[float]] = []
        self.static: list[float] = []
        self.slot_of: list[int] = []
        self.positions: list[int] = []
        self.candidates: list[WorkerSnapshot] = []
        self.totals: list[float] = []
        self.rejected: tuple[Rejection, ...] = ()
        self.pos_of: dict[str, int] | None = None  # worker id → input position, built lazily
        # Shortlist of input positions (see the module docstring); None: build on next use.
        self.short: set[int] | None = None
        self.floor = 0.0
        self.depth = 0
        self.crowded = False  # too many ties for a shortlist; retried after a re-layout
        # input position → (snapshot, contributions of the memoised scorers), for ranked workers
        self.contributions: dict[int, tuple[WorkerSnapshot, tuple[Contribution, ...]]] = {}
        # (rejected, reason, retry, explanation) of the last empty decision, while it holds
        self.empty: tuple[tuple[Rejection, ...], NoCandidate, float | None, str] | None = None
        # The candidates' smallest measured RTT (the affinity scorers' distance gate); UNSET:
        # recompute on next use. Kept through patches that cannot have changed it.
        self.nearest: float | Unset | None = UNSET

    def nearest_rtt_ms(self) -> float | None:
        if isinstance(self.nearest, Unset):
            self.nearest = nearest_rtt_ms(self.candidates)
        return self.nearest

    def rtt_changed(self, old: float | None, new: float | None) -> None:
        """A kept candidate's RTT went from ``old`` to ``new``: keep the minimum when that
        cannot have moved it, or lower it, else leave it to be recomputed."""
        nearest = self.nearest
        if isinstance(nearest, Unset) or old == new:
            return
        if new is not None and (nearest is None or new <= nearest):
            self.nearest = new
        elif old is not None and nearest is not None and old <= nearest:
            self.nearest = UNSET  # the nearest one moved away: someone else may be nearest now

    def find(self, worker_id: str) -> int | None:
        """The candidate index of the worker with this id, or ``None`` if it is not one."""
        if self.pos_of is None:
            ids = map(_WORKER_ID, self.workers)
            self.pos_of = dict(zip(ids, range(len(self.workers)), strict=False))
        p = self.pos_of.get(worker_id)
        if p is None or self.verdicts[p] is not None:
            return None
        return self.slot_of[p]

    def shortlist(self) -> tuple[set[int], int] | None:
        """Candidate indices holding the best ``depth`` totals and all their ties, and
        ``depth``; ``None`` when a shortlist would not pay off: few candidates, or so many
        tied at the top that it would hold most of them (then until the next re-layout)."""
        totals = self.totals
        if len(totals) <= _SHORTLIST or self.crowded:
            return None
        short = self.short
        if short is None or self.depth < _MIN_DEPTH or len(short) > _MAX_SHORTLIST:
            self.floor = kth_largest(totals, _SHORTLIST)
            slots = compress(range(len(totals)), map(_LE, repeat(self.floor), totals))
            short = set(map(self.positions.__getitem__, slots))
            if len(short) > _MAX_SHORTLIST:
                self.short = None
                self.crowded = True
                return None
            self.short = short
            self.depth = len(short)
        verdicts, slot_of = self.verdicts, self.slot_of
        return {slot_of[p] for p in short if verdicts[p] is None}, self.depth

    def update(self, p: int, verdict: Rejection | None, total: float) -> None:
        """Record position ``p``'s new verdict and total, keeping the shortlist's invariant:
        every kept worker outside it totals below ``floor``, and ``depth`` kept members total
        at least ``floor``."""
        short = self.short
        if short is not None:
            floor = self.floor
            was = p in short and self.verdicts[p] is None and self.static[p] >= floor
            now = verdict is None and total >= floor
            if now and p not in short:
                short.add(p)
            self.depth += now - was
        self.verdicts[p] = verdict
        self.static[p] = total


class Incremental:
    """Evaluates a profile's WorkerFilters (in order) and WorkerScorers (weighted) over a
    worker list, incrementally per query class. Not thread-safe."""

    __slots__ = (
        "_filter_calls",
        "_filters",
        "_key_of",
        "_max_classes",
        "_scorer_calls",
        "_scorers",
        "_views",
    )

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
        # Every memoised plugin's key function, filters then scorers, bound once: the class
        # key is built on every decision.
        self._key_of = tuple([f.key for f in self._filters] + [s.key for s, _ in self._scorers])
        # and their batch functions with their type names (timing buckets), for _evaluate
        self._filter_calls = tuple((f.reject, f.TYPE) for f in self._filters)
        self._scorer_calls = tuple((s.scores, s.TYPE, share) for s, share in self._scorers)
        self._max_classes = max_classes
        self._views: OrderedDict[tuple[Hashable, ...], ClassMemo] = OrderedDict()

    def scorer_keys(self, view: ClassMemo) -> tuple[Hashable, ...]:
        return view.keys[len(self._filters) :]

    def view(
        self,
        query: RouteQuery,
        workers: Sequence[WorkerSnapshot],
        ns: Timings,
        scope: Hashable = None,
    ) -> ClassMemo:
        """The memo for this query's class over ``workers``; ``scope`` (which part of the
        fleet they are, e.g. the region stage's regions) is part of the class."""
        keys = tuple([key(query) for key in self._key_of])
        if scope is not None:
            keys += (scope,)
        views = self._views
        view = views.get(keys)
        n = len(workers)
        if view is None or len(view.workers) != n:
            view = ClassMemo(keys)
            views[keys] = view
            if len(views) > self._max_classes:
                views.popitem(last=False)
            self._rebuild(view, list(workers), ns)
            return view
        views.move_to_end(keys)
        changed = changed_positions(workers, view.workers)
        if len(changed) * 2 > n:
            self._rebuild(view, list(workers), ns)
        elif changed:
            self._patch(view, workers, changed, ns)
        return view

    # --- evaluation ---------------------------------------------------------------------

    def _evaluate(
        self, view: ClassMemo, batch: list[WorkerSnapshot], ns: Timings
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
        for (reject, name), key in zip(self._filter_calls, keys, strict=False):
            if not subset:
                break
            t0 = perf_counter_ns()
            reasons = reject(subset, key)
            ns[name] += perf_counter_ns() - t0
            if len(reasons) != len(subset):
                raise _miscounted(name, reasons, subset)
            if reasons.count(None) == len(subset):
                continue
            indices = range(size) if pending is None else pending
            still: list[int] = []
            for j, w, reason in zip(indices, subset, reasons, strict=False):
                if reason is None:
                    still.append(j)
                else:
                    verdicts[j] = Rejection(w.worker_id, w.region, name, reason)
            pending = still
            subset = [batch[j] for j in still]
        raw: list[list[float]] = []
        sums = [0.0] * size
        scorer_keys = keys[len(self._filters) :]
        for (scores, name, share), key in zip(self._scorer_calls, scorer_keys, strict=False):
            t0 = perf_counter_ns()
            values = scores(batch, key)
            ns[name] += perf_counter_ns() - t0
            if len(values) != size:
                raise _miscounted(name, values, batch)
            # The framework's clamp (see framework.clamp), inlined: NaN and below 0 → 0.
            sums = [
                acc + (0.0 if not v > 0.0 else share if v > 1.0 else v * share)
                for acc, v in zip(sums, values, strict=False)
            ]
            raw.append(values)
        return verdicts, raw, sums

    def _rebuild(self, view: ClassMemo, workers: list[WorkerSnapshot], ns: Timings) -> None:
        verdicts, raw, static = self._evaluate(view, workers, ns)
        view.workers = workers
        view.verdicts = verdicts
        view.raw = raw
        view.static = static
        view.pos_of = None
        view.short = None
        view.contributions = {}
        self._compact(view)
        view.rejected = tuple(compress(verdicts, map(_IS_NOT, verdicts, repeat(None))))  # type: ignore[arg-type]

    @staticmethod
    def _compact(view: ClassMemo) -> None:
        keep = list(map(_IS, view.verdicts, repeat(None)))
        view.positions = list(compress(range(len(keep)), keep))
        view.candidates = list(compress(view.workers, keep))
        view.totals = list(compress(view.static, keep))
        # Running count of kept workers: a kept worker's candidate index.
        view.slot_of = list(accumulate(keep, initial=-1))[1:]
        view.crowded = False
        view.nearest = UNSET

    def _patch(
        self,
        view: ClassMemo,
        workers: Sequence[WorkerSnapshot],
        changed: list[int],
        ns: Timings,
    ) -> None:
        batch = [workers[i] for i in changed]
        verdicts, raw, static = self._evaluate(view, batch, ns)
        flipped = False
        rejections_changed = False
        for j, p in enumerate(changed):
            old = view.verdicts[p]
            new = verdicts[j]
            if old is not None and new is not None and old == new:
                new = old  # rejected again for the same reason: the rejections stand as they are
            if view.workers[p].worker_id != batch[j].worker_id:
                view.pos_of = None  # a different worker at this position
            if new is None and old is None:
                view.rtt_changed(view.workers[p].rtt_ms, batch[j].rtt_ms)
            view.workers[p] = batch[j]
            view.update(p, new, static[j])
            if old is not new:
                rejections_changed = True
                flipped = flipped or (old is None) != (new is None)
            if new is None and not flipped:
                c = view.slot_of[p]
                view.candidates[c] = batch[j]
                view.totals[c] = static[j]
        for k, values in enumerate(raw):
            column = view.raw[k]
            for j, p in enumerate(changed):
                column[p] = values[j]
        if flipped:
            self._compact(view)
        if rejections_changed:
            vs = view.verdicts
            view.rejected = tuple(compress(vs, map(_IS_NOT, vs, repeat(None))))  # type: ignore[arg-type]


def _miscounted(plugin: str, answers: Sequence[object], batch: Sequence[object]) -> RuntimeError:
    """A plugin must answer once per worker (checked once, so the loops can zip freely)."""
    return RuntimeError(f"plugin '{plugin}' answered {len(answers)} times for {len(batch)} workers")
