"""How much memory a scenario will need, estimated before anything is built.

The big terms, each measured on CPython 3.11 (every run reports the estimate beside the peak
RSS it reached, so the two can be compared: bench/README.md):

- per replica and worker: one ``WorkerSnapshot`` row (~260 B) and, per query class the
  scheduler sees (model × tier × residency set, at most its 64), the incremental view's columns
  (~16 pointers and 6 floats per worker, ~250 B);
- per worker: the engine model (~3 KB; the exact engine's block-level KV cache ~50 B a block);
- per request in flight (twice each engine's max_num_seqs, plus every background stream):
  ~2 KB; per open conversation ~200 B;
- metrics: bounded (histograms, one row per interval).

A scenario whose estimate exceeds ``limits.max_memory_mib`` (or 80 % of the memory available
on this machine) is refused with the estimate and its breakdown.
"""

from __future__ import annotations

import os
from collections import Counter

from services.planet.scenario import Scenario

SNAPSHOT_B = 260
CLASS_VIEW_B_PER_WORKER = 250
ENGINE_B = 3_000
EXACT_BLOCK_B = 50
REQUEST_B = 2_000
CONVERSATION_B = 200
BASE_MIB = 120.0  # the interpreter, the router's modules, matplotlib not yet imported


def query_classes(sc: Scenario) -> int:
    models = max(1, len({m.model for m in sc.traffic.mixes}) or len(sc.models()))
    tiers = max(1, len({t.tier for t in sc.traffic.tenants}))
    residency = max(1, len({t.residency for t in sc.traffic.tenants}))
    if any(t.residency == ("local",) for t in sc.traffic.tenants):
        residency += len({s.zone for s in sc.sites.values()})
    return min(64, models * tiers * residency)


def estimate(sc: Scenario) -> tuple[float, str]:
    """(MiB, a one-line breakdown)."""
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
    rate = sc.traffic.rate_per_s or (len(sc.traffic.trace or ()) / max(1.0, sc.duration_s))
    conversations = min(rate * 600, 4000 * replicas * max(1, len(sc.traffic.mixes)))
    requests = in_flight * REQUEST_B + conversations * CONVERSATION_B
    mib = BASE_MIB + (views + engines + requests) / 2**20
    breakdown = (
        f"router views {views / 2**20:,.0f} MiB for {replicas} replicas x {workers:,} workers x "
        f"~{classes} query classes, engines {engines / 2**20:,.0f} MiB, requests and "
        f"conversations {requests / 2**20:,.0f} MiB"
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
