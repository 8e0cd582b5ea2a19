"""Top-k with random tie-breaking, without sorting or shuffling the whole list.

The rule (GIE's ``max_score_picker``): shuffle the candidates, then stable-sort by score,
descending, and take the first ``k``. Equal workers therefore share the next burst instead of
the first one in registry order taking all of it.

Shuffling and sorting 1,000 candidates on every decision costs more than the rest of the
decision, so :class:`TopK` computes the same result from a small *shortlist*:

1. Shortlist every candidate whose total is at least a threshold ``h`` (one C-level pass). If
   the shortlist holds at least ``k`` candidates, it holds the top ``k`` *and* every candidate
   tied with the k-th, because anything left out scores below ``h``, which is at most the k-th
   best score. Otherwise, fall back to ``h`` = the k-th best score (``heapq.nlargest``).
2. Within the shortlist: candidates strictly above the k-th best score are ranked by score,
   equal scores in random order; the remaining places go to a uniform random sample of the
   candidates *at* the k-th best score, in random order. That is exactly the distribution of
   shuffle-then-stable-sort.

``h`` is only a hint, carried from one decision to the next (scores move little between two
decisions): after each decision it is set to the ``depth``-th best score of the shortlist, so
the next shortlist is about ``depth`` long. A stale hint costs speed, never correctness.
"""

from __future__ import annotations

import heapq
import operator
import random
from collections.abc import Sequence
from itertools import compress, repeat

_LE = operator.le


class TopK:
    """Stateful top-k (the threshold hint); one per picker."""

    __slots__ = ("_depth", "_hint")

    def __init__(self, depth: int = 32) -> None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self._depth = depth
        self._hint: float | None = None

    def __call__(self, totals: Sequence[float], k: int, rng: random.Random) -> list[int]:
        """Indices of the ``k`` highest totals, best first, ties in random order."""
        n = len(totals)
        if k <= 0 or n == 0:
            return []
        if k >= n:
            order = list(range(n))
            rng.shuffle(order)
            order.sort(key=totals.__getitem__, reverse=True)
            return order
        hint = self._hint
        shortlist: list[int] = []
        if hint is not None:
            shortlist = list(compress(range(n), map(_LE, repeat(hint), totals)))
        if len(shortlist) < k:
            floor = heapq.nlargest(min(n, max(k, self._depth)), totals)[-1]
            shortlist = list(compress(range(n), map(_LE, repeat(floor), totals)))
        shortlist.sort(key=totals.__getitem__, reverse=True)
        self._hint = totals[shortlist[min(len(shortlist), self._depth) - 1]]
        kth = totals[shortlist[k - 1]]
        if len(shortlist) == k or totals[shortlist[k]] < kth:
            top = shortlist[:k]  # nobody outside the top k ties with the k-th
            if len(set(map(totals.__getitem__, top))) == k:
                return top  # and no ties inside: the common case
            rng.shuffle(top)
            top.sort(key=totals.__getitem__, reverse=True)
            return top
        above = [i for i in shortlist[:k] if totals[i] > kth]
        tied = [i for i in shortlist if totals[i] == kth]
        if len(set(map(totals.__getitem__, above))) < len(above):  # ties above the k-th
            rng.shuffle(above)
            above.sort(key=totals.__getitem__, reverse=True)
        return above + rng.sample(tied, k - len(above))


def top_k(totals: Sequence[float], k: int, rng: random.Random) -> list[int]:
    """Stateless :class:`TopK` (no hint): for one-off calls and tests."""
    return TopK()(totals, k, rng)
