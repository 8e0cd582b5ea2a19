"""How a decision explains itself: one line for the winner, a reason when nothing is left.

The winner line compares the winner with the runner-up signal by signal (each signal's
weighted contribution, so the numbers add up to the score difference) and names the signals
that decided it, e.g.::

    w-eu-1 (eu-west) 0.712 beat w-ap-1 (ap-south) 0.598: queue +0.150 (slots 9+0+0/20 vs
    19+0+0/20), kv-cache +0.067 (kv=0.45 vs kv=0.95); despite latency -0.105 (rtt=60.0ms vs
    rtt=2.0ms) [3 ranked of 998 candidates, 2 filtered]

An empty decision is classified for the caller (each class maps to one gRPC status):

- ``UNKNOWN_MODEL``: no worker lists the model at all, in any state — unless some worker has
  not told us its models yet (no report: unhealthy with an empty model list) or there are no
  workers at all, in which case the model may well exist and the answer is ``UNAVAILABLE``
  (a router that just started must not answer 404 for every model);
- ``REGION_NOT_ALLOWED``: the request restricts regions and the model is listed only outside
  them (data residency is never relaxed);
- ``SATURATED``: a filter whose ``EMPTY_REASON`` is SATURATED (admission) removed at least one
  worker that had passed every earlier filter, so capacity, not health, is missing; the retry
  hint is the longest any such filter asks for;
- ``UNAVAILABLE``: anything else (nothing healthy and ready right now).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from services.common.capabilities import unmet
from services.router.scheduling.plugin import Filter
from services.router.scheduling.types import (
    NoCandidate,
    Rejection,
    RouteQuery,
    ScoredWorker,
    WorkerSnapshot,
)

_DECIDING_SIGNALS = 3
_OPPOSING_SIGNALS = 2


def _who(s: ScoredWorker) -> str:
    return f"{s.worker.worker_id} ({s.worker.region}) {s.score:.3f}"


def explain_winner(ranked: Sequence[ScoredWorker], candidates: int, filtered: int) -> str:
    """One line: why ``ranked[0]`` won, in terms of per-signal contributions."""
    if not ranked:
        return ""
    win = ranked[0]
    tail = f" [{len(ranked)} ranked of {candidates} candidates, {filtered} filtered]"
    if len(ranked) == 1:
        top = sorted(win.contributions, key=lambda c: c.weighted, reverse=True)
        parts = [_signal(c.signal, c.weighted, c.detail) for c in top[:_DECIDING_SIGNALS]]
        body = ", ".join(parts) if parts else "no scorers"
        return f"{_who(win)} was the only candidate left: {body}{tail}"
    run = ranked[1]
    diffs = [
        (c.signal, c.weighted - r.weighted, c.detail, r.detail)
        for c, r in zip(win.contributions, run.contributions, strict=True)
    ]
    if win.score == run.score:
        return f"{_who(win)} tied with {_who(run)}; the tie was broken at random{tail}"
    gains = sorted((d for d in diffs if d[1] > 0), key=lambda d: d[1], reverse=True)
    losses = sorted((d for d in diffs if d[1] < 0), key=lambda d: d[1])
    line = f"{_who(win)} beat {_who(run)}"
    if gains:
        line += ": " + ", ".join(_versus(*d) for d in gains[:_DECIDING_SIGNALS])
    if losses:
        line += "; despite " + ", ".join(_versus(*d) for d in losses[:_OPPOSING_SIGNALS])
    return line + tail


def _signal(signal: str, value: float, detail: str) -> str:
    return f"{signal} {value:.3f} ({detail})" if detail else f"{signal} {value:.3f}"


def _versus(signal: str, diff: float, mine: str, theirs: str) -> str:
    detail = f" ({mine} vs {theirs})" if mine or theirs else ""
    return f"{signal} {diff:+.3f}{detail}"


def classify_empty(
    query: RouteQuery,
    workers: Sequence[WorkerSnapshot],
    rejected: Sequence[Rejection],
    filters: Sequence[Filter],
    unavailable_retry_after_s: float | None,
) -> tuple[NoCandidate, float | None]:
    """Why nothing is left, and when to retry (``None``: retrying will not help)."""
    model = query.model
    if not any(w.model(model) is not None for w in workers):  # stops at the first that does
        if workers and all(w.models or w.healthy for w in workers):
            return NoCandidate.UNKNOWN_MODEL, None
        return NoCandidate.UNAVAILABLE, unavailable_retry_after_s
    allowed = query.allowed_regions
    if allowed and not any(w.region in allowed and w.model(model) is not None for w in workers):
        return NoCandidate.REGION_NOT_ALLOWED, None
    removed_by = {r.filter for r in rejected}
    if "capability" in removed_by and not _capable_anywhere(query, workers):
        return NoCandidate.UNSUPPORTED, None
    waits = [
        f.retry_hint_s()
        for f in filters
        if f.EMPTY_REASON is NoCandidate.SATURATED and f.TYPE in removed_by
    ]
    if waits:
        known = [s for s in waits if s is not None]
        return NoCandidate.SATURATED, max(known) if known else None
    return NoCandidate.UNAVAILABLE, _readmission_wait(
        workers, rejected, filters, unavailable_retry_after_s
    )


def _readmission_wait(
    workers: Sequence[WorkerSnapshot],
    rejected: Sequence[Rejection],
    filters: Sequence[Filter],
    default_s: float | None,
) -> float | None:
    """An UNAVAILABLE decision's retry hint: when the first removed worker passes again by
    itself, if every filter that removed someone knows (all ejected: the first to leave
    its failure window), never below ``default_s``; otherwise ``default_s``."""
    if default_s is None or not rejected:
        return default_s
    by_id = {w.worker_id: w for w in workers}
    removed: dict[str, list[WorkerSnapshot]] = {}
    for r in rejected:
        snap = by_id.get(r.worker_id)
        if snap is not None:
            removed.setdefault(r.filter, []).append(snap)
    earliest = math.inf
    for f in filters:
        mine = removed.get(f.TYPE)
        if not mine:
            continue
        wait = f.readmits_in_s(mine)
        if wait is None:
            return default_s
        earliest = min(earliest, wait)
    return max(default_s, earliest) if math.isfinite(earliest) else default_s


def _capable_anywhere(query: RouteQuery, workers: Sequence[WorkerSnapshot]) -> bool:
    """Some worker in the allowed regions serves the model with everything the request needs
    (healthy or not: if it is down, the request should wait for it, not be refused)."""
    allowed = query.allowed_regions
    for w in workers:
        status = w.model(query.model)
        if status is None or (allowed and w.region not in allowed):
            continue
        if unmet(status.capabilities, query.needs) is None:
            return True
    return False


def explain_empty(query: RouteQuery, reason: NoCandidate, rejected: Sequence[Rejection]) -> str:
    """One line: what removed the workers, per filter, with one example reason each."""
    counts: dict[str, int] = {}
    example: dict[str, str] = {}
    for r in rejected:
        counts[r.filter] = counts.get(r.filter, 0) + 1
        example.setdefault(r.filter, f"{r.worker_id}: {r.reason}")
    head = f"no candidate for model '{query.model}' ({reason.value})"
    if not counts:
        return f"{head}: no worker was offered"
    parts = [f"{name} removed {n} (e.g. {example[name]})" for name, n in counts.items()]
    return f"{head}: " + "; ".join(parts)
