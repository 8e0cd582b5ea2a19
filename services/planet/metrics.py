"""What a run measured, in bounded memory: log-bucketed histograms per group (region served,
edge site, tier), counters, and time series per report interval.

A histogram keeps counts in buckets 2 % wide (``bucket = floor(log(ms) / log(1.02))``), so a
percentile is exact to within 2 % whatever the number of requests, and memory is a few hundred
buckets per group. Goodput is the share of *all* requests (refused ones included) whose first
token came within the TTFT SLO (and whose mean inter-token gap met the ITL SLO, when one is
set) — what a user got, not what the fleet chose to serve.

Oscillation: the traffic split between regions is recorded per ``oscillation_window_s``; the
index is the mean, over consecutive windows, of half the L1 distance between their split
vectors — the share of traffic that changed region from one window to the next (0: steady; a
router flapping all of its traffic between two regions scores 1).
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_LOG_BASE = math.log(1.02)


def bucket(ms: float) -> int:
    """The histogram bucket of a latency (2 % wide, 0.01 ms and below in one)."""
    return int(math.log(ms if ms > 0.01 else 0.01) / _LOG_BASE)


class Histogram:
    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.count = 0
        self.total = 0.0

    def add(self, ms: float) -> None:
        self.add_bucket(bucket(ms), ms)

    def add_bucket(self, b: int, ms: float) -> None:
        """Count ``ms`` whose bucket (:func:`bucket`) the caller has computed: a value goes
        into four or five groups' histograms, and one logarithm serves them all."""
        self.buckets[b] += 1
        self.count += 1
        self.total += ms

    def merge(self, other: Histogram) -> None:
        self.buckets.update(other.buckets)
        self.count += other.count
        self.total += other.total

    def percentile(self, q: float) -> float:
        if self.count == 0:
            return math.nan
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for b in sorted(self.buckets):
            seen += self.buckets[b]
            if seen >= rank:
                return math.exp((b + 0.5) * _LOG_BASE)
        return math.nan

    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan


@dataclass
class Sample:
    t: float
    site: str
    tier: str
    explanation: str
    ranked: list[tuple[str, float]]


@dataclass
class Metrics:
    slo_ttft_ms: float
    slo_itl_ms: float | None
    interval_s: float
    window_s: float
    sample_size: int
    seed: int
    ttft: defaultdict[tuple[str, str], Histogram] = field(
        default_factory=lambda: defaultdict(Histogram)
    )
    itl: defaultdict[tuple[str, str], Histogram] = field(
        default_factory=lambda: defaultdict(Histogram)
    )
    e2e: defaultdict[tuple[str, str], Histogram] = field(
        default_factory=lambda: defaultdict(Histogram)
    )
    counts: Counter[str] = field(default_factory=Counter)
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tier, reason)
    arrivals: Counter[str] = field(default_factory=Counter)  # by tier
    good: Counter[str] = field(default_factory=Counter)  # by tier
    resolved: Counter[str] = field(default_factory=Counter)  # finished or refused, by tier
    served: Counter[tuple[str, str]] = field(default_factory=Counter)  # (site, region)
    residency_violations: int = 0
    series: list[dict[str, Any]] = field(default_factory=list)
    _interval: dict[str, Any] = field(default_factory=dict)
    _window: Counter[str] = field(default_factory=Counter)
    _last_window: Counter[str] | None = None  # the latest closed window that held traffic
    _shift_total: float = 0.0  # sum of the shares moved between consecutive such windows
    _shifts: int = 0
    _window_end: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    _seen_decisions: int = 0
    _slot: int = 0
    _rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._window_end = self.window_s
        self._new_interval()

    def _new_interval(self) -> None:
        self._interval = {
            "ttft": Histogram(),
            "requests": 0,
            "refused": 0,
            "good": 0,
            "regions": Counter(),
        }

    # --- recording -----------------------------------------------------------------------

    def arrival(self, tier: str) -> None:
        self.arrivals[tier] += 1
        self._interval["requests"] += 1

    def refuse(self, tier: str, reason: str) -> None:
        self.refused[(tier, reason)] += 1
        self.resolved[tier] += 1
        self._interval["refused"] += 1

    def routed(self, t: float, region: str) -> None:
        if t >= self._window_end:
            self._close_window()
            # Straight to the window holding t: windows with no traffic in between are skipped
            # without a step each (a tiny window over an hour must not become a billion steps).
            end = (math.floor(t / self.window_s) + 1) * self.window_s
            self._window_end = end if end > t else math.nextafter(t, math.inf)
        self._window[region] += 1
        self._interval["regions"][region] += 1

    def first_token(self, site: str, region: str, tier: str, ttft_ms: float) -> None:
        b = bucket(ttft_ms)
        ttft = self.ttft
        ttft[("all", "")].add_bucket(b, ttft_ms)
        ttft[("region", region)].add_bucket(b, ttft_ms)
        ttft[("site", site)].add_bucket(b, ttft_ms)
        ttft[("tier", tier)].add_bucket(b, ttft_ms)
        self._interval["ttft"].add_bucket(b, ttft_ms)

    def done(
        self, site: str, region: str, tier: str, ttft_ms: float, itl_ms: float | None, e2e_ms: float
    ) -> None:
        e2e, itl = self.e2e, self.itl
        b_e2e = bucket(e2e_ms)
        b_itl = bucket(itl_ms) if itl_ms is not None else 0
        for key in (("all", ""), ("region", region), ("site", site), ("tier", tier)):
            e2e[key].add_bucket(b_e2e, e2e_ms)
            if itl_ms is not None:
                itl[key].add_bucket(b_itl, itl_ms)
        self.served[(site, region)] += 1
        self.resolved[tier] += 1
        ok = ttft_ms <= self.slo_ttft_ms and (
            self.slo_itl_ms is None or itl_ms is None or itl_ms <= self.slo_itl_ms
        )
        if ok:
            self.good[tier] += 1
            self._interval["good"] += 1

    def wants_sample(self) -> bool:
        """Reservoir sampling of decisions over the whole run (algorithm R): whether this
        decision is kept; if so the caller hands it to :meth:`sample`."""
        self._seen_decisions += 1
        if self.sample_size == 0:
            return False
        if len(self.samples) < self.sample_size:
            self._slot = len(self.samples)
            return True
        j = self._rng.randrange(self._seen_decisions)
        self._slot = j
        return j < self.sample_size

    def sample(
        self, t: float, site: str, tier: str, explanation: str, ranked: list[tuple[str, float]]
    ) -> None:
        s = Sample(t, site, tier, explanation, ranked)
        if self._slot >= len(self.samples):
            self.samples.append(s)
        else:
            self.samples[self._slot] = s

    def close_interval(self, t: float, utilisation: dict[str, float], rate: float) -> None:
        iv = self._interval
        h: Histogram = iv["ttft"]
        self.series.append(
            {
                "t_s": t,
                "requests": iv["requests"],
                "refused": iv["refused"],
                "good": iv["good"],
                "offered_per_s": rate,
                "ttft_p50_ms": h.percentile(0.5),
                "ttft_p99_ms": h.percentile(0.99),
                "regions": dict(iv["regions"]),
                "utilisation": utilisation,
            }
        )
        self._new_interval()

    # --- summaries -----------------------------------------------------------------------

    def _close_window(self) -> None:
        """Fold the window just ended into the index and keep only it: memory stays constant
        however many windows a run has."""
        b = self._window
        self._window = Counter()
        nb = sum(b.values())
        if nb == 0:
            return
        a = self._last_window
        if a is not None:
            na = sum(a.values())
            self._shift_total += 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))
            self._shifts += 1
        self._last_window = b

    def oscillation(self) -> float:
        """Over the windows closed so far (the one still open is partial and left out)."""
        return self._shift_total / self._shifts if self._shifts else 0.0

    def goodput(self, tiers: Iterable[str] | None = None, *, resolved_only: bool = False) -> float:
        """Good requests over all that arrived (refusals and unfinished ones are misses), or,
        ``resolved_only``, over those that finished or were refused: a run stopped early
        (Ctrl-C) is not charged for the streams it cut."""
        names = list(tiers) if tiers is not None else list(self.arrivals)
        counted = self.resolved if resolved_only else self.arrivals
        total = sum(counted[t] for t in names)
        return sum(self.good[t] for t in names) / total if total else math.nan
