"""The extension points of the scheduling framework: one tiny interface each.

Modelled on the Gateway API Inference Extension's endpoint picker
(``pkg/epp/framework/interface/scheduling/plugins.go``)::

    Filter.filter(query, workers)  -> (kept, rejections)     hard constraints
    Scorer.score(query, candidates) -> {worker_id: 0..1}     one signal, unweighted
    Picker.pick(query, scored)      -> ranked indices        primary + fallbacks
    PostPick.observe(query, decision)                        learn from decisions (affinity)

Every plugin is a small class with a ``TYPE`` name (what profiles refer to) and a
``from_params`` factory that reads and validates its parameters. A scorer never knows its
weight; the framework clamps scores to [0, 1], weights them and times every call.

Two refinements, both for speed in CPython (see ``incremental.py``):

- :class:`WorkerFilter` and :class:`WorkerScorer` are filters and scorers whose answer for a
  worker depends only on that worker's snapshot and a small *query key* (the model, the
  priority tier, the allowed regions...). They state the formula once, over a batch of workers,
  and the framework evaluates it only for the snapshots that changed since the previous
  decision with the same keys, so a warm decision over 1,000 workers costs a few passes at C
  speed instead of 1,000 x (number of plugins) Python calls. They still implement the plain
  ``filter``/``score`` interface, for tests and other callers.
- :meth:`Scorer.score` may return a *sparse* mapping: a worker it does not mention scores 0.
  The affinity scorers mention only the few workers that hold a session or a prefix.
"""

from __future__ import annotations

import abc
import functools
import operator
import random
from collections.abc import (
    Callable,
    Collection,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import ClassVar, Generic, Self, TypeVar, overload

from services.common.clock import SYSTEM_CLOCK, Clock
from services.router.scheduling.params import Params
from services.router.scheduling.types import (
    Decision,
    NoCandidate,
    Rejection,
    RouteQuery,
    WorkerSnapshot,
)

K = TypeVar("K", bound=Hashable)

_WORKER_ID = operator.attrgetter("worker_id")
_RTT_MS = operator.attrgetter("rtt_ms")
_IS_MEASURED = functools.partial(operator.is_not, None)


class Unset:
    """A cached value not computed yet, where ``None`` is a valid value."""


UNSET = Unset()


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginContext:
    """What a plugin factory may need besides its parameters: the clock (for expiring state)."""

    clock: Clock = SYSTEM_CLOCK


class Candidates(Sequence[WorkerSnapshot]):
    """The workers that survived the filters, in input order, with lookup by worker id.

    Sparse scorers name workers by id. The lookup is ``find`` when the framework has one that
    persists across decisions, else an index built on first use. Read-only, and valid during
    one decision only.
    """

    __slots__ = ("_find", "_index", "_nearest", "_nearest_rtt_ms", "_workers")

    def __init__(
        self,
        workers: Sequence[WorkerSnapshot],
        find: Callable[[str], int | None] | None = None,
        nearest: Callable[[], float | None] | None = None,
    ) -> None:
        self._workers = workers
        self._find = find
        self._nearest = nearest  # kept across decisions by the framework, when it has one
        self._index: dict[str, int] | None = None
        self._nearest_rtt_ms: float | Unset | None = UNSET

    def __len__(self) -> int:
        return len(self._workers)

    @overload
    def __getitem__(self, i: int) -> WorkerSnapshot: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[WorkerSnapshot]: ...
    def __getitem__(self, i: int | slice) -> WorkerSnapshot | Sequence[WorkerSnapshot]:
        return self._workers[i]

    def __iter__(self) -> Iterator[WorkerSnapshot]:
        return iter(self._workers)

    def index_of(self, worker_id: str) -> int | None:
        """Position of the worker with this id, or ``None`` when it is not a candidate."""
        if self._find is not None:
            return self._find(worker_id)
        if self._index is None:
            ids = map(_WORKER_ID, self._workers)
            self._index = dict(zip(ids, range(len(self._workers)), strict=False))
        return self._index.get(worker_id)

    def get(self, worker_id: str) -> WorkerSnapshot | None:
        i = self.index_of(worker_id)
        return None if i is None else self._workers[i]

    def nearest_rtt_ms(self) -> float | None:
        """The smallest measured RTT among the candidates (``None``: none measured).

        From the framework's view when it keeps one across decisions (updated as snapshots
        change), else computed once per decision however many scorers ask.
        """
        if isinstance(self._nearest_rtt_ms, Unset):
            if self._nearest is not None:
                self._nearest_rtt_ms = self._nearest()
            else:
                self._nearest_rtt_ms = nearest_rtt_ms(self._workers)
        return self._nearest_rtt_ms


def nearest_rtt_ms(workers: Iterable[WorkerSnapshot]) -> float | None:
    """The smallest measured RTT in ``workers``, in one C-level pass (no Python frame per
    worker; still ~50 µs at 1,000 workers, hence the caching above)."""
    return min(filter(_IS_MEASURED, map(_RTT_MS, workers)), default=None)


@dataclass(frozen=True, slots=True)
class Scored:
    """The picker's input: candidates and their weighted totals (aligned), and the framework's
    random source for tie-breaking (seedable, so tests are deterministic).

    ``hint``, when the framework has one, computes on demand a shortlist: candidate indices
    that contain the ``depth`` best candidates by total *and every candidate tied with them*.

    ``boosts``: for the candidates an affinity (sparse) scorer scored, what those scorers added
    to their totals — a warm prefix or a live session, as opposed to load and distance.
    """

    candidates: Candidates
    totals: Sequence[float]
    rng: random.Random
    hint: Callable[[], tuple[Collection[int], int] | None] | None = None
    boosts: Mapping[int, float] = field(default_factory=dict)

    def shortlist(self) -> tuple[Collection[int], int] | None:
        """``(indices, depth)``: a picker that needs no more than ``depth`` of the best may
        rank these instead of scanning all totals. ``None`` when there is no shortlist."""
        return None if self.hint is None else self.hint()


class Plugin(abc.ABC):
    """Common shape: a type name for profiles and a validating factory."""

    __slots__ = ()
    TYPE: ClassVar[str]

    @classmethod
    @abc.abstractmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        """Build the plugin from its profile parameters (``params`` raises on bad values)."""


class Filter(Plugin):
    """A hard constraint: keeps some workers, rejects the others with a reason."""

    __slots__ = ()
    #: When a decision comes back empty and this filter removed someone, the reason to report
    #: (the admission filter says SATURATED); ``None`` leaves the classification to the
    #: framework (see ``explain.classify_empty``).
    EMPTY_REASON: ClassVar[NoCandidate | None] = None

    @abc.abstractmethod
    def filter(
        self, query: RouteQuery, workers: Sequence[WorkerSnapshot]
    ) -> tuple[Sequence[WorkerSnapshot], list[Rejection]]:
        """Return the workers kept (input order) and a rejection for each one removed."""

    def retry_hint_s(self) -> float | None:
        """How long a client should wait when this filter emptied the decision."""
        return None

    def readmits_in_s(self, rejected: Sequence[WorkerSnapshot]) -> float | None:
        """When the first of ``rejected`` (workers this filter removed) passes it again by
        itself, in seconds: ``math.inf`` if time alone never changes the verdict (the
        request's own constraints), ``None`` if it can change at any moment (health). An
        UNAVAILABLE decision's Retry-After is the earliest of these, when every filter that
        removed someone knows (see ``explain.classify_empty``)."""
        return None


class WorkerFilter(Filter, Generic[K]):
    """A filter whose verdict on a worker depends only on that worker and ``key(query)``.

    The framework asks again only about snapshots it has not judged under the same keys:
    implement ``key`` (return ``None`` when the verdict does not depend on the query) and
    ``reject``, the formula over a batch. It must be a pure function of its arguments.
    """

    __slots__ = ()

    @abc.abstractmethod
    def key(self, query: RouteQuery) -> K:
        """The part of the query the verdict depends on (hashable, few distinct values)."""

    @abc.abstractmethod
    def reject(self, workers: Sequence[WorkerSnapshot], key: K) -> list[str | None]:
        """For each worker, why it must not serve (``None``: it may)."""

    def filter(
        self, query: RouteQuery, workers: Sequence[WorkerSnapshot]
    ) -> tuple[Sequence[WorkerSnapshot], list[Rejection]]:
        kept: list[WorkerSnapshot] = []
        rejected: list[Rejection] = []
        for w, reason in zip(workers, self.reject(workers, self.key(query)), strict=True):
            if reason is None:
                kept.append(w)
            else:
                rejected.append(Rejection(w.worker_id, w.region, self.TYPE, reason))
        return kept, rejected


class Scorer(Plugin):
    """One signal: a score per candidate, higher is better. The framework clamps it to [0, 1]
    and applies the weight the profile gives it; a worker missing from the result scores 0."""

    __slots__ = ()

    @abc.abstractmethod
    def score(self, query: RouteQuery, candidates: Candidates) -> Mapping[str, float]:
        """Scores by worker id (sparse allowed)."""

    def detail(self, query: RouteQuery, worker: WorkerSnapshot) -> str:
        """The raw input behind this worker's score, human-readable ("rtt=31.2ms")."""
        return ""


class WorkerScorer(Scorer, Generic[K]):
    """A scorer whose score for a worker depends only on that worker and ``key(query)``; the
    framework asks again only about snapshots it has not scored under the same keys. Implement
    ``key``, ``scores`` (the formula over a batch, aligned with its input; pure) and
    ``describe``."""

    __slots__ = ()

    @abc.abstractmethod
    def key(self, query: RouteQuery) -> K:
        """The part of the query the score depends on (``None`` when it does not)."""

    @abc.abstractmethod
    def scores(self, workers: Sequence[WorkerSnapshot], key: K) -> list[float]:
        """One score per worker, aligned with ``workers``."""

    @abc.abstractmethod
    def describe(self, worker: WorkerSnapshot, key: K) -> str:
        """The raw input behind the score, human-readable."""

    def score(self, query: RouteQuery, candidates: Candidates) -> Mapping[str, float]:
        values = self.scores(list(candidates), self.key(query))
        return dict(zip(map(_WORKER_ID, candidates), values, strict=True))

    def detail(self, query: RouteQuery, worker: WorkerSnapshot) -> str:
        return self.describe(worker, self.key(query))


class Picker(Plugin):
    """Turns scored candidates into a ranked list (primary first, then fallbacks)."""

    __slots__ = ()

    @abc.abstractmethod
    def pick(self, query: RouteQuery, scored: Scored) -> tuple[int, ...]:
        """Indices into ``scored.candidates``, best first, without repeats."""


class PostPick(abc.ABC):
    """Optional hook for stateful plugins that learn from each decision (affinity)."""

    __slots__ = ()

    @abc.abstractmethod
    def observe(self, query: RouteQuery, decision: Decision) -> None:
        """Called once per non-empty decision, after it is final (its timings are filled in
        after every hook has run). Keep it cheap: it is on the decision path."""
