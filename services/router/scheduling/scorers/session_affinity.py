"""``session-affinity``: keep a conversation on the worker that served its last turn, while
that worker is not overloaded.

    score(w) = 1   if w served this session's last decision (within ttl_s) and
                   load(w) < max_load
             = 0   otherwise (sparse: only the holder is named)

Intent: the previous turn's KV cache (and any engine-side session state) lives on that worker;
staying there saves prefill and keeps latency steady within a conversation. Affinity yields to
load: past ``max_load`` the holder scores 0, the request goes wherever the other signals say,
and the session moves with it (``observe`` records the new primary).

State: session id → (worker id, expiry), LRU-bounded by ``max_entries`` and expiring after
``ttl_s`` of inactivity. The edge may hash session ids; they are opaque here.

Like prefix affinity, it yields to distance (:mod:`..distance`): a holder more than
``max_extra_rtt_ms`` beyond the nearest candidate scores 0, so one unlucky first turn in a far
region does not keep a whole conversation there.

Input: ``query.session_id``, the holder's load (``loadmodel.worker_load``) and RTT.
Parameters: ``max_load`` (> 0, default 0.85), ``ttl_s`` (> 0, default 1800), ``max_entries``
(≥ 1, default 100000), ``max_extra_rtt_ms`` (≥ 0, default 50).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import ClassVar, Self

from services.common.clock import Clock
from services.router.scheduling.distance import too_far
from services.router.scheduling.loadmodel import worker_load
from services.router.scheduling.params import Params, check_positive, require
from services.router.scheduling.plugin import Candidates, PluginContext, PostPick, Scorer
from services.router.scheduling.types import Decision, RouteQuery, WorkerSnapshot


class SessionAffinityScorer(Scorer, PostPick):
    TYPE: ClassVar[str] = "session-affinity"
    __slots__ = ("_clock", "_sessions", "max_entries", "max_extra_rtt_ms", "max_load", "ttl_s")

    def __init__(
        self,
        *,
        clock: Clock,
        max_load: float = 0.85,
        ttl_s: float = 1800.0,
        max_entries: int = 100_000,
        max_extra_rtt_ms: float = 50.0,
    ) -> None:
        check_positive(max_load, "max_load")
        check_positive(ttl_s, "ttl_s")
        require(max_entries >= 1, "max_entries", "must be >= 1")
        require(max_extra_rtt_ms >= 0, "max_extra_rtt_ms", "must be >= 0")
        self.max_extra_rtt_ms = max_extra_rtt_ms
        self.max_load = max_load
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(
            clock=ctx.clock,
            max_load=params.number("max_load", 0.85),
            ttl_s=params.number("ttl_s", 1800.0),
            max_entries=params.integer("max_entries", 100_000),
            max_extra_rtt_ms=params.number("max_extra_rtt_ms", 50.0),
        )

    def __len__(self) -> int:
        return len(self._sessions)

    def holder(self, session_id: str) -> str | None:
        """The worker holding this session now, or ``None`` (unknown or expired)."""
        entry = self._sessions.get(session_id) if session_id else None
        if entry is None or entry[1] <= self._clock.monotonic():
            return None
        return entry[0]

    def score(self, query: RouteQuery, candidates: Candidates) -> Mapping[str, float]:
        worker_id = self.holder(query.session_id)
        if worker_id is None:
            return {}
        w = candidates.get(worker_id)
        if w is None or worker_load(w) >= self.max_load:
            return {}
        if too_far(w, candidates.nearest_rtt_ms(), self.max_extra_rtt_ms):
            return {}
        return {worker_id: 1.0}

    def detail(self, query: RouteQuery, worker: WorkerSnapshot) -> str:
        worker_id = self.holder(query.session_id)
        if worker_id is None:
            return "no session" if not query.session_id else "new session"
        if worker_id != worker.worker_id:
            return f"session on {worker_id}"
        load = worker_load(worker)
        if load >= self.max_load:
            return f"session here, but load {load:.2f} >= {self.max_load:g}"
        return "session here"

    def observe(self, query: RouteQuery, decision: Decision) -> None:
        if not decision.ranked or not query.session_id:
            return
        now = self._clock.monotonic()
        sessions = self._sessions
        sessions.pop(query.session_id, None)
        sessions[query.session_id] = (decision.ranked[0].worker.worker_id, now + self.ttl_s)
        while len(sessions) > self.max_entries:
            sessions.popitem(last=False)
        while sessions:
            _, (_, expires) = next(iter(sessions.items()))
            if expires > now:
                break
            sessions.popitem(last=False)
