"""In-process cost of one routing decision with the default profile, by worker count.

    .venv/bin/python -m bench.router_decision [--workers 10 100 1000] [--calls 3000] [--seed 1]

Prints p50/p99/max microseconds of ``SchedulerProfile.schedule`` (wall clock around the call,
GC on), and p50/p99 of the CPU time it used (``time.thread_time_ns``: unlike wall time, not
inflated when the OS runs another process in the middle of a decision, which on a shared 2-core box
dominates the wall-clock tail), for three ways the fleet can hand snapshots in:

- ``steady``: between load reports; only the worker picked last time has a new snapshot (its
  ``in_flight`` changed), as the fleet's assignment accounting does;
- ``churn``: as steady, plus 1 % of the workers (at least one) get a new snapshot per decision —
  fresh load reports or probes (1,000 workers reporting 10x/s at 1,000 decisions/s);
- ``cold``: every snapshot is new on every decision (no memo hit at all: the worst case, and
  what a fleet that rebuilds every snapshot per call would cost).

Queries: STANDARD priority, one model served by 90 % of the workers (the others serve a
different one), half with a session id and prefix hashes drawn from 200 conversations, so the
affinity scorers find state. Goal: steady p99 <= 200 us at 1,000 workers.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from time import perf_counter_ns, thread_time_ns

from services.common import cli
from services.common.clock import ManualClock
from services.router.scheduling.framework import SchedulerProfile
from services.router.scheduling.profile import load_profile
from services.router.scheduling.types import (
    ModelState,
    ModelStatus,
    Priority,
    RouteQuery,
    WorkerSnapshot,
)

PROFILE = Path(__file__).resolve().parents[1] / "deploy/router/profiles/default.yaml"
REGIONS = ("seoul", "tokyo", "singapore", "mumbai", "frankfurt", "london", "virginia", "oregon")
MODEL = "meridian-8b"
SCENARIOS = ("steady", "churn", "cold")


def make_worker(rng: random.Random, i: int) -> WorkerSnapshot:
    region = REGIONS[i % len(REGIONS)]
    model = MODEL if rng.random() < 0.9 else "other-70b"
    max_running = 64
    running = rng.randint(0, 56)
    return WorkerSnapshot(
        worker_id=f"w-{region}-{i}",
        region=region,
        address=f"10.0.{i // 250}.{i % 250}:7000",
        models=(ModelStatus(model, ModelState.READY, 8192),),
        rtt_ms=rng.uniform(1.0, 180.0),
        loss=rng.choice((0.0, 0.0, 0.0, 0.01)),
        report_age_s=rng.uniform(0.0, 0.2),
        running=running,
        waiting=rng.choice((0, 0, 0, 2)),
        max_running=max_running,
        kv_cache_usage=min(1.0, running / max_running + rng.uniform(-0.1, 0.1)),
        tokens_per_second=running * rng.uniform(20.0, 45.0),
        gpu_utilization=rng.uniform(0.2, 1.0),
        in_flight=rng.randint(0, 2),
    )


def make_query(rng: random.Random, n: int) -> RouteQuery:
    conversation = rng.randrange(200)
    chatty = rng.random() < 0.5
    return RouteQuery(
        request_id=f"r{n}",
        model=MODEL,
        priority=Priority.STANDARD,
        session_id=f"s{conversation}" if chatty else "",
        prefix_hashes=tuple(hash((conversation, b)) for b in range(8)) if chatty else (),
        prompt_tokens=900,
        max_tokens=256,
    )


def refresh(w: WorkerSnapshot, rng: random.Random) -> WorkerSnapshot:
    """A new load report for this worker."""
    running = rng.randint(0, 56)
    return dataclasses.replace(
        w,
        running=running,
        kv_cache_usage=min(1.0, running / w.max_running + rng.uniform(-0.1, 0.1)),
        in_flight=0,
    )


def run(
    scheduler: SchedulerProfile, n: int, scenario: str, calls: int, seed: int
) -> tuple[list[float], list[float], int]:
    """Wall-clock and CPU times (us) of ``calls`` decisions after a warm-up, and how many came
    back empty. CPU time (this thread's) leaves out time the OS gave to other processes, so
    its p99 shows the code's own tail on a shared machine."""
    rng = random.Random(seed)
    workers = [make_worker(rng, i) for i in range(n)]
    position = {w.worker_id: i for i, w in enumerate(workers)}
    churn = max(1, n // 100)
    samples: list[float] = []
    cpu: list[float] = []
    empty = 0
    warmup = 50
    for k in range(calls + warmup):
        query = make_query(rng, k)
        if scenario == "cold":
            workers = [dataclasses.replace(w) for w in workers]
        elif scenario == "churn":
            for i in rng.sample(range(n), churn):
                workers[i] = refresh(workers[i], rng)
        c0 = thread_time_ns()
        t0 = perf_counter_ns()
        decision = scheduler.schedule(query, workers)
        elapsed = perf_counter_ns() - t0
        spent = thread_time_ns() - c0
        if k >= warmup:
            samples.append(elapsed / 1000)
            cpu.append(spent / 1000)
        if decision.ranked:  # the fleet's in-flight accounting: a new snapshot
            picked = decision.ranked[0].worker
            i = position[picked.worker_id]
            # Bounded, so that load stays stationary over thousands of decisions.
            workers[i] = dataclasses.replace(picked, in_flight=(picked.in_flight + 1) % 4)
        else:
            empty += k >= warmup
    return samples, cpu, empty


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=cli.positive_int, nargs="+", default=[10, 100, 1000])
    p.add_argument(
        "--calls", type=cli.positive_int, default=3000, help="decisions per steady/churn row"
    )
    p.add_argument(
        "--cold-calls", type=cli.positive_int, default=300, help="decisions per cold row"
    )
    p.add_argument("--seed", type=cli.integer(0), default=1)
    p.add_argument("--profile", type=Path, default=PROFILE)
    args = p.parse_args(argv)

    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cpus, load average {load1:.2f} (other work on the box shows up in "
        f"p99/max); profile {args.profile.name}"
    )
    print(
        f"{'workers':>7} {'scenario':>8} {'calls':>6} {'p50_us':>8} {'p99_us':>8} "
        f"{'max_us':>8} {'mean_us':>8} {'cpu_p50':>8} {'cpu_p99':>8} {'empty':>6}"
    )
    for n in args.workers:
        for scenario in SCENARIOS:
            clock = ManualClock()
            scheduler = load_profile(args.profile, clock=clock, rng=random.Random(args.seed))
            calls = args.cold_calls if scenario == "cold" else args.calls
            samples, cpu, empty = run(scheduler, n, scenario, calls, args.seed)
            print(
                f"{n:>7} {scenario:>8} {len(samples):>6} {percentile(samples, 0.5):>8.1f} "
                f"{percentile(samples, 0.99):>8.1f} {max(samples):>8.1f} "
                f"{statistics.fmean(samples):>8.1f} {percentile(cpu, 0.5):>8.1f} "
                f"{percentile(cpu, 0.99):>8.1f} {empty:>6}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
