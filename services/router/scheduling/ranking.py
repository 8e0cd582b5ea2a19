"""Top-k with random tie-breaking, without sorting or shuffling the whole list.

The rule (GIE's ``max_score_picker``): shuffle the candidates, then stable-sort by score,
descending, and take the first ``k``. Equal workers therefore share the next burst instead of
the first one in fleet order taking all of it.

Shuffling and sorting 1,000 candidates on every decision costs more than the rest of the
decision, so :func:`top_k` computes the same result from a small *shortlist*: a set of
candidates that contains the best ``k`` and every candidate tied with the k-th. Either the
caller has one (the framework maintains one incrementally, see ``incremental.py``), or it is
the candidates scoring at least the ``max(k, 32)``-th best score (:func:`kth_largest` and one
``compress`` pass). Within the shortlist: candidates strictly above
the k-th best score are ranked by score, equal scores in random order; the remaining places go
to a uniform random sample of the candidates *at* the k-th best score, in random order — which
is exactly the distribution of shuffle-then-stable-sort.
"""

from __future__ import annotations

import heapq
import operator
import random
from collections.abc import Collection, Sequence
from itertools import compress, repeat

_LE = operator.le
_DEPTH = 32


_SORT_BELOW = 1024  # up to this many values, a C sort beats heapq.nlargest's Python loop


def kth_largest(values: Sequence[float], k: int) -> float:
    """The ``k``-th largest of ``values`` (the smallest when there are fewer than ``k``;
    ``values`` not empty and free of NaN, as clamped totals are; ``k`` >= 1):
    ``heapq.nlargest(k, values)[-1]``.

    ``heapq.nlargest`` iterates in Python; for the ~100 workers of one region a C-level
    ``sorted`` is several times faster, and gives the same value."""
    if len(values) <= _SORT_BELOW:
        return sorted(values, reverse=True)[min(k, len(values)) - 1]
    return heapq.nlargest(k, values)[-1]


def top_k(
    totals: Sequence[float],
    k: int,
    rng: random.Random,
    shortlist: Collection[int] | None = None,
) -> list[int]:
    """Indices of the ``k`` highest totals, best first, ties in random order.

    ``shortlist``: indices known to contain the best ``k`` and all ties with the k-th.
    """
    n = len(totals)
    if k <= 0 or n == 0:
        return []
    if k >= n:
        order = list(range(n))
        rng.shuffle(order)
        order.sort(key=totals.__getitem__, reverse=True)
        return order
    if shortlist is None:
        floor = kth_largest(totals, max(k, _DEPTH))
        short = list(compress(range(n), map(_LE, repeat(floor), totals)))
    else:
        short = list(shortlist)
    short.sort(key=totals.__getitem__, reverse=True)
    kth = totals[short[k - 1]]
    if len(short) == k or totals[short[k]] < kth:
        top = short[:k]  # nobody outside the top k ties with the k-th
        if len(set(map(totals.__getitem__, top))) == k:
            return top  # and no ties inside: the common case
        rng.shuffle(top)
        top.sort(key=totals.__getitem__, reverse=True)
        return top
    above = [i for i in short[:k] if totals[i] > kth]
    tied = [i for i in short if totals[i] == kth]
    if len(set(map(totals.__getitem__, above))) < len(above):  # ties above the k-th
        rng.shuffle(above)
        above.sort(key=totals.__getitem__, reverse=True)
    return above + rng.sample(tied, k - len(above))
