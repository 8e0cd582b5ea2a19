"""How much memory a scenario will need, estimated before anything is built.

The big terms, each measured on CPython 3.11 (every run reports the estimate beside the peak
RSS it reached, so the two can be compared: bench/README.md):

- per replica and worker: one ``WorkerSnapshot`` row (~260 B) and, per query class the
  scheduler sees (model × tier × residency set, at most its 64), the incremental view's columns
  (~16 pointers and 6 floats per worker, ~250 B);
- per worker: the engine model (~3 KB; the exact engine's block-level KV cache ~50 B a block);
- per request in flight (twice each engine's max_num_seqs, plus every background stream):
  ~2 KB; per open conversation ~200 B;
- per replica, the profile's affinity scorers' maps (``prefix-affinity``: block hash →
  worker, ~230 B an entry with its key; ``session-affinity``: session → worker, ~130 B), each
  bounded by its ``max_entries`` and by the new prefix blocks that can arrive within its
  ``ttl_s``. At planet scale these are the largest term: 30 replicas × 200,000 prefix
  entries ≈ 1.3 GB (a 10-minute planet run peaked at 1,769 MiB against an estimate of
  988 MiB that left them out);
- metrics: bounded (histograms, one row per interval).

A scenario whose estimate exceeds ``limits.max_memory_mib`` (or 80 % of the memory available
on this machine) is refused with the estimate and its breakdown.
"""

from __future__ import annotations

import math
import os
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from services.planet.demand import HASH_BLOCK_TOKENS, MAX_HASH_BLOCKS
from services.planet.scenario import Scenario

SNAPSHOT_B = 260
CLASS_VIEW_B_PER_WORKER = 250
ENGINE_B = 3_000
EXACT_BLOCK_B = 50
REQUEST_B = 2_000
CONVERSATION_B = 200
#: per entry of an affinity scorer's map, key included (tracemalloc on a planet run)
AFFINITY_ENTRY_B = {"prefix-affinity": 230, "session-affinity": 130}
BASE_MIB = 120.0  # the interpreter, the router's modules, matplotlib not yet imported


def query_classes(sc: Scenario) -> int:
    models = max(1, len({m.model for m in sc.traffic.mixes}) or len(sc.models()))
    tiers = max(1, len({t.tier for t in sc.traffic.tenants}))
    residency = max(1, len({t.residency for t in sc.traffic.tenants}))
    if any(t.residency == ("local",) for t in sc.traffic.tenants):
        residency += len({s.zone for s in sc.sites.values()})
    return min(64, models * tiers * residency)


def _rate(sc: Scenario) -> float:
    """Mean requests per second: the scenario's rate, or its trace's over the run."""
    return sc.traffic.rate_per_s or (len(sc.traffic.trace or ()) / max(1.0, sc.duration_s))


def _new_blocks_per_request(sc: Scenario, max_blocks: int) -> float:
    """Prefix hashes a request can add that no earlier one had: its message's and, in the
    next turn's history, its answer's (log-normal means, clipped; the system prompt's are
    shared), one per hashed block as the demand model makes them. A trace's records are not
    read here: the most each."""
    cap = float(min(max_blocks, MAX_HASH_BLOCKS))
    if not sc.traffic.mixes:
        return cap
    shares = sum(m.share for m in sc.traffic.mixes) or 1.0
    out = 0.0
    for m in sc.traffic.mixes:
        tokens = sum(
            min(d.hi, d.median * math.exp(d.sigma**2 / 2))
            for d in (m.prompt_tokens, m.output_tokens)
        )
        out += m.share / shares * min(cap, tokens / HASH_BLOCK_TOKENS)
    return out


def affinity_bytes(sc: Scenario, profile: Path) -> float:
    """What every replica's affinity maps together can hold under ``profile``: per scorer,
    ``max_entries`` per replica, or fewer when the whole scenario's traffic within its
    ``ttl_s`` could not fill them. A profile that does not load counts 0 here (the caller
    reports it)."""
    from services.planet.sim import VirtualClock
    from services.router.scheduling.profile import ProfileError, load_profile

    try:
        profile_ = load_profile(profile, clock=VirtualClock(), rng=random.Random(0))
    except (ProfileError, OSError, ValueError):
        return 0.0
    rate = _rate(sc)
    replicas = len(sc.sites)
    total = 0.0
    for ws in profile_.scorers:
        scorer = ws.scorer
        per_entry = AFFINITY_ENTRY_B.get(getattr(scorer, "TYPE", ""))
        if per_entry is None:
            continue
        window = min(float(getattr(scorer, "ttl_s", sc.duration_s)), sc.duration_s)
        per_request = (
            _new_blocks_per_request(sc, int(scorer.max_blocks))
            if hasattr(scorer, "max_blocks")
            else 1.0
        )
        arriving = rate * window * per_request
        bound = replicas * float(getattr(scorer, "max_entries", arriving))
        total += min(bound, arriving) * per_entry
    return total


def estimate(sc: Scenario, profiles: Sequence[Path] = ()) -> tuple[float, str]:
    """(MiB, a one-line breakdown) for one run of the scenario under the largest of
    ``profiles`` (none given: the scenario's own)."""
    workers = len(sc.workers)
    replicas = len(sc.sites)
    classes = min(query_classes(sc), 8)  # a replica keeps views only for classes it sees
    views = replicas * workers * (SNAPSHOT_B + classes * CLASS_VIEW_B_PER_WORKER)
    engines = workers * ENGINE_B
    if sc.engine == "exact":
        engines += sum(w.config.num_kv_blocks for w in sc.workers) * EXACT_BLOCK_B
    in_flight = 0.0
    for w in sc.workers:
        in_flight += w.config.max_num_seqs * 2  # running + a queue as long again
    workers_in = Counter(w.region for w in sc.workers)
    in_flight += sum(bg.streams_per_worker * workers_in[bg.region] for bg in sc.background)
    rate = _rate(sc)
    conversations = min(rate * 600, 4000 * replicas * max(1, len(sc.traffic.mixes)))
    requests = in_flight * REQUEST_B + conversations * CONVERSATION_B
    affinity = max(affinity_bytes(sc, p) for p in (profiles or [sc.router.profile]))
    mib = BASE_MIB + (views + affinity + engines + requests) / 2**20
    breakdown = (
        f"router views {views / 2**20:,.0f} MiB for {replicas} replicas x {workers:,} workers x "
        f"~{classes} query classes, affinity maps {affinity / 2**20:,.0f} MiB, engines "
        f"{engines / 2**20:,.0f} MiB, requests and conversations {requests / 2**20:,.0f} MiB"
    )
    return mib, breakdown


def available_mib() -> float:
    """Memory this process could still get (MemAvailable), or inf where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (ValueError, OSError):
        return float("inf")


def limit_mib(sc: Scenario) -> float:
    machine = 0.8 * available_mib()
    return min(sc.max_memory_mib, machine) if sc.max_memory_mib is not None else machine
