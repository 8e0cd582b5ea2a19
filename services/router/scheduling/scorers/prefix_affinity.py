"""``prefix-affinity``: send a prompt to the worker that most recently served its longest
known prefix, so the engine's prefix cache skips recomputing it.

    score(w) = matched_blocks(w) / len(prefix_hashes)

``prefix_hashes`` are the edge's hashes of the prompt's leading blocks, chained (hash i covers
blocks 0..i), so equal hashes mean equal prefixes and the prompt itself never reaches the
router. The scorer remembers, per block hash, the worker the router last sent it to; walking
the query's hashes from the first, each worker's score is the length of the prefix it was
last sent, as a share of the prompt. Only the workers named score (a sparse result).

Intent: a multi-turn conversation or a shared system prompt whose KV blocks are still cached
on one worker costs that worker a fraction of the prefill; the weight decides how much load
difference that saving is worth.

State (updated by ``observe`` for each decision's primary worker): an LRU map from block hash
to (worker id, expiry), bounded by ``max_entries`` (oldest dropped first) and expiring after
``ttl_s`` (engines evict cold blocks too). Memory ≈ 150 bytes per entry.

Distance gate (:mod:`..distance`): a cached prefix saves prefill (milliseconds per thousand
tokens on a GPU); a far region costs its whole extra round trip on the first token. A worker
more than ``max_extra_rtt_ms`` beyond the nearest candidate scores 0 here, so affinity tips
choices between nearby workers but never pulls a request across an ocean for a warm cache
(bench/routing_quality.py showed the p99 tail that came from exactly that).

Input: ``query.prefix_hashes``, the candidates' ``rtt_ms``. Parameters: ``max_entries`` (≥ 1,
default 200000), ``ttl_s`` (> 0, default 600), ``max_blocks`` (≥ 1, default 128: longer prompts
use their first blocks), ``max_extra_rtt_ms`` (≥ 0, default 50; 0 allows only the nearest).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import ClassVar, Self

from services.common.clock import Clock
from services.router.scheduling.distance import too_far
from services.router.scheduling.params import Params, check_positive, require
from services.router.scheduling.plugin import Candidates, PluginContext, PostPick, Scorer
from services.router.scheduling.types import Decision, RouteQuery, WorkerSnapshot


class PrefixAffinityScorer(Scorer, PostPick):
    TYPE: ClassVar[str] = "prefix-affinity"
    __slots__ = ("_clock", "_entries", "max_blocks", "max_entries", "max_extra_rtt_ms", "ttl_s")

    def __init__(
        self,
        *,
        clock: Clock,
        max_entries: int = 200_000,
        ttl_s: float = 600.0,
        max_blocks: int = 128,
        max_extra_rtt_ms: float = 50.0,
    ) -> None:
        require(max_entries >= 1, "max_entries", "must be >= 1")
        require(max_extra_rtt_ms >= 0, "max_extra_rtt_ms", "must be >= 0")
        self.max_extra_rtt_ms = max_extra_rtt_ms
        check_positive(ttl_s, "ttl_s")
        require(max_blocks >= 1, "max_blocks", "must be >= 1")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.max_blocks = max_blocks
        self._clock = clock
        self._entries: OrderedDict[int, tuple[str, float]] = OrderedDict()

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls(
            clock=ctx.clock,
            max_entries=params.integer("max_entries", 200_000),
            ttl_s=params.number("ttl_s", 600.0),
            max_blocks=params.integer("max_blocks", 128),
            max_extra_rtt_ms=params.number("max_extra_rtt_ms", 50.0),
        )

    def __len__(self) -> int:
        return len(self._entries)

    def _matches(self, hashes: tuple[int, ...]) -> dict[str, int]:
        """Worker id → number of leading blocks last sent to it."""
        entries = self._entries
        if not entries:
            return {}
        now = self._clock.monotonic()
        best: dict[str, int] = {}
        for i, h in enumerate(hashes[: self.max_blocks]):
            entry = entries.get(h)
            if entry is None or entry[1] <= now:
                break
            best[entry[0]] = i + 1
        return best

    def score(self, query: RouteQuery, candidates: Candidates) -> Mapping[str, float]:
        hashes = query.prefix_hashes
        if not hashes:
            return {}
        matches = self._matches(hashes)
        if not matches:
            return {}
        n = min(len(hashes), self.max_blocks)
        nearest = candidates.nearest_rtt_ms()
        out = {}
        for wid, m in matches.items():
            worker = candidates.get(wid)
            if worker is not None:
                out[wid] = 0.0 if too_far(worker, nearest, self.max_extra_rtt_ms) else m / n
        return out

    def detail(self, query: RouteQuery, worker: WorkerSnapshot) -> str:
        n = min(len(query.prefix_hashes), self.max_blocks)
        if not n:
            return "no prefix"
        m = self._matches(query.prefix_hashes).get(worker.worker_id, 0)
        return f"prefix={m}/{n} blocks"  # the distance gate shows as a 0 score

    def observe(self, query: RouteQuery, decision: Decision) -> None:
        if not decision.ranked or not query.prefix_hashes:
            return
        worker_id = decision.ranked[0].worker.worker_id
        now = self._clock.monotonic()
        entries = self._entries
        value = (worker_id, now + self.ttl_s)
        for h in query.prefix_hashes[: self.max_blocks]:
            entries.pop(h, None)
            entries[h] = value
        # Oldest first: drop what is over the bound, then what has expired.
        while len(entries) > self.max_entries:
            entries.popitem(last=False)
        while entries:
            _, (_, expires) = next(iter(entries.items()))
            if expires > now:
                break
            entries.popitem(last=False)
