"""Fidelity of the planet simulator: ``bench.routing_quality``'s hotspot, simulated and real.

    .venv/bin/python -m bench.planet_fidelity [--rate 20] [--duration 15] [--seed 7]
        [--profiles default round-robin nearest-region least-loaded power-of-two] [--sim-only]
        [--write-trace deploy/sim/hotspot-trace.jsonl]

The same arrivals (``routing_quality.plan``), the same prompts (120 conversations with ~900-
token system prompts), the same regions, RTTs, worker settings, background load and router
profiles run twice: on the real local stack (``routing_quality.run_profile``: gRPC workers
with ``SimEngine`` behind delay proxies, the real router) and in the simulator
(``services/planet``, exact engine: ``SimScheduler`` stepped in virtual time, the router's
Scheduler on an aged view). Prints TTFT p50/p99 and the region split for both and their
differences. Goal: within 15 % on TTFT p50 and p99, within 5 points on the split.
``--write-trace`` writes the trace the checked-in scenario ``deploy/sim/hotspot.yaml`` replays
(token counts and prefix structure, without the prompt text).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from bench import routing_quality as rq
from services.common import cli
from services.edge.openai_types import ChatCompletionRequest
from services.edge.prompt import BLOCK_CHARS, prefix_hashes
from services.planet.scenario import build
from services.planet.sim import Planet
from services.worker.engine import ChatTurn
from services.worker.sim.text import render_chat, tokenize

ROOT = Path(__file__).resolve().parents[1]
# The Route RPC on loopback (~1 ms, bench/README.md router_rpc) plus the decision.
ROUTE_MS = 1.5
# The calibration pass: this many requests, one at a time, on the idle stack before the
# measured traffic. What the real stack takes beyond the simulator's prediction for them (the
# median) is Meridian's own processing on this machine: the scenario's ``router.service_ms``.
CALIBRATION_REQUESTS = 8
# A request during whose wait for its first token (and the 100 ms before it,
# ``LagMeter.LOOKBACK_S``) the event loop ran this late, summed, measures the machine: every
# component shares one process here, so a starved process delays all of them at once (an
# engine step that wakes late delays every sequence in its batch), which a fleet of separate
# servers does not do and the simulator does not model. Such requests are left out of both
# sides (the comparison is paired, request by request).
LATE_MS = 10.0
# More than this share of the requests held up by the machine: the run is void (the test
# skips, naming the lag and the CPU wait).
MAX_LATE_SHARE = 1 / 3


def trace(asks: Sequence[rq.Ask], with_text: bool) -> list[dict[str, Any]]:
    out = []
    for a in asks:
        system = rq.system_prompt(a.conversation)
        messages = [("system", system), ("user", a.question)]
        prompt = len(tokenize(render_chat([ChatTurn(r, t) for r, t in messages])))
        shared = len(tokenize(render_chat([ChatTurn("system", system)])[: -len("<|assistant|>\n")]))
        body = ChatCompletionRequest.model_validate(
            {"model": rq.MODEL, "messages": [{"role": r, "content": t} for r, t in messages]}
        )
        rec: dict[str, Any] = {
            "at_s": round(a.at_s, 6),
            "site": "seoul",
            "model": rq.MODEL,
            "prompt_tokens": prompt,
            "output_tokens": a.max_tokens,
            "max_tokens": a.max_tokens,
            "prefix_key": f"conversation-{a.conversation}",
            "prefix_tokens": shared,
            "hash_blocks": len(prefix_hashes(body)),
            "shared_hash_blocks": (len(f"<|system|>{system}\n")) // BLOCK_CHARS,
        }
        if with_text:
            rec["messages"] = messages
        out.append(rec)
    return out


def scenario(
    trace_path: Path,
    duration_s: float,
    profile: str,
    engine: str = "exact",
    service_ms: float = 0.0,
) -> dict[str, Any]:
    cfg = rq.sim_config()
    regions = [
        {"code": "kr", "lat": 37.57, "lon": 126.98, "zone": "kr"},
        {"code": "jp", "lat": 35.68, "lon": 139.69, "zone": "jp"},
        {"code": "us", "lat": 39.04, "lon": -77.49, "zone": "us"},
    ]
    return {
        "name": "hotspot",
        "seed": 7,
        "duration_s": duration_s + 0.001,
        "engine": engine,
        "world": {
            "regions": regions,
            "sites": [
                {"name": "seoul", "lat": 37.57, "lon": 126.98, "utc_offset_h": 9, "zone": "kr"}
            ],
        },
        "network": {
            "links": [
                {"site": "seoul", "region": r, "rtt_ms": 2 * d} for r, (d, _) in rq.REGIONS.items()
            ]
        },
        "fleet": {
            "gpus": {
                "sim": {
                    "max_num_seqs": cfg.max_num_seqs,
                    "output_len_min": 16,
                    "output_len_max": 64,
                }
            },
            "groups": [
                {"regions": [r], "workers": n, "gpu": "sim", "models": [rq.MODEL]}
                for r, (_, n) in rq.REGIONS.items()
            ],
        },
        "router": {
            "profile": str(rq.PROFILES_DIR / f"{profile}.yaml"),
            "report_interval_ms": 100,
            "route_ms": ROUTE_MS,
            "service_ms": round(service_ms, 3),
        },
        "traffic": {"trace": str(trace_path)},
        "background": [
            {
                "region": rq.HOT_REGION,
                "streams_per_worker": rq.HOT_SLOTS,
                "max_tokens": 128,
                "prompt_tokens": 12,
            }
        ],
        "slo": {"ttft_ms": 150},
        "report": {"sample_decisions": 0},
    }


#: request index (the trace's order) → (TTFT ms, region)
Served = dict[int, tuple[float, str]]


def write_trace(path: Path, asks: Sequence[rq.Ask]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in trace(asks, with_text=True)) + "\n")
    return path


def simulate_served(
    trace_path: Path, duration_s: float, profile: str, service_ms: float = 0.0
) -> Served:
    sc = build(
        scenario(trace_path, duration_s, profile, service_ms=service_ms),
        source="hotspot",
        base=ROOT,
    )
    planet = Planet(sc, record=True)
    planet.run()
    return {rid - 1: (t, region) for t, region, rid in planet.records or []}


def simulate(
    trace_path: Path, duration_s: float, profile: str, service_ms: float = 0.0
) -> tuple[list[float], Counter[str], int]:
    served = simulate_served(trace_path, duration_s, profile, service_ms)
    return (
        [t for t, _ in served.values()],
        Counter(r for _, r in served.values()),
        len(served),
    )


def real(asks: Sequence[rq.Ask], profile: str, seed: int) -> tuple[list[float], Counter[str], int]:
    result: rq.Result = uvloop.run(rq.run_profile(profile, asks, seed))
    ttfts = result.ttfts_ms()
    regions = Counter(o.region for o in result.outcomes if o.region)
    return ttfts, regions, len(result.outcomes)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return rq.pct(ordered, q) if ordered else math.nan


def compare(
    sim: tuple[list[float], Counter[str], int], live: tuple[list[float], Counter[str], int]
) -> dict[str, float]:
    st, sr, sn = sim
    lt, lr, ln = live
    out = {
        "sim_p50": pct(st, 0.5), "real_p50": pct(lt, 0.5),
        "sim_p99": pct(st, 0.99), "real_p99": pct(lt, 0.99),
    }  # fmt: skip
    out["p50_error"] = out["sim_p50"] / out["real_p50"] - 1
    out["p99_error"] = out["sim_p99"] / out["real_p99"] - 1
    out["split_points"] = max(
        abs(100 * sr[g] / max(1, sn) - 100 * lr[g] / max(1, ln)) for g in rq.REGIONS
    )
    for g in rq.REGIONS:
        out[f"sim_{g}"] = 100 * sr[g] / max(1, sn)
        out[f"real_{g}"] = 100 * lr[g] / max(1, ln)
    return out


@dataclass(frozen=True, slots=True)
class Check:
    """One paired run: the real stack (calibration pass, then the measured traffic) and the
    simulator with the calibrated ``service_ms``, compared on the requests the machine did not
    hold up (the same requests on both sides)."""

    service_ms: float  # calibrated
    requests: int
    late: int  # requests the machine held up (``LATE_MS``), left out of both sides
    comparison: dict[str, float]
    loop_lag_ms: float
    loop_stall_ms: float
    cpu_wait_ms: float
    wall_s: float

    @property
    def void(self) -> str | None:
        """Why this run measured the machine instead of the stack, or None."""
        share = self.late / max(1, self.requests)
        if share <= MAX_LATE_SHARE:
            return None
        return (
            f"the machine held up {self.late}/{self.requests} requests "
            f"(the event loop ran > {LATE_MS:g} ms late while they waited; loop lag p99 "
            f"{self.loop_lag_ms:.0f} ms, worst {self.loop_stall_ms:.0f} ms; the process waited "
            f"{self.cpu_wait_ms:.0f} ms for a CPU in {self.wall_s:.0f} s): its TTFTs measure "
            "this machine, not the stack"
        )


def calibrate(
    real_runs: Sequence[rq.Outcome], late_ms: Sequence[float], workdir: Path, profile: str
) -> float:
    """Meridian's processing per request on this machine: the median of (real − simulated)
    TTFT over the calibration requests that both served in the same region and the machine
    did not hold up."""
    asks = rq.calibration_asks(len(real_runs))
    path = write_trace(workdir / "calibration.jsonl", asks)
    sim = simulate_served(path, len(asks) + 1.0, profile)
    gaps = [
        o.ttft_s * 1000 - sim[i][0]
        for i, (o, late) in enumerate(zip(real_runs, late_ms, strict=True))
        if o.ttft_s is not None and i in sim and sim[i][1] == o.region and late <= LATE_MS
    ]
    return max(0.0, statistics.median(gaps)) if gaps else 0.0


def check(
    asks: Sequence[rq.Ask], duration_s: float, profile: str, seed: int, workdir: Path
) -> Check:
    t0 = time.monotonic()
    result: rq.Result = uvloop.run(
        rq.run_profile(profile, asks, seed, calibrate=rq.calibration_asks(CALIBRATION_REQUESTS))
    )
    wall = time.monotonic() - t0
    service_ms = calibrate(result.calibration, result.calibration_late_ms, workdir, profile)
    sim = simulate_served(
        write_trace(workdir / "trace.jsonl", asks), duration_s, profile, service_ms
    )
    kept = [i for i, late in enumerate(result.late_ms) if late <= LATE_MS]
    real_kept = [result.outcomes[i] for i in kept]
    sim_kept = [sim[i] for i in kept if i in sim]
    live = (
        sorted(o.ttft_s * 1000 for o in real_kept if o.ttft_s is not None),
        Counter(o.region for o in result.outcomes if o.region),
        len(result.outcomes),
    )
    simulated = (
        sorted(t for t, _ in sim_kept),
        Counter(r for _, r in sim.values()),
        len(asks),
    )
    return Check(
        service_ms=service_ms,
        requests=len(asks),
        late=len(asks) - len(kept),
        comparison=compare(simulated, live),
        loop_lag_ms=result.loop_lag_ms,
        loop_stall_ms=result.loop_stall_ms,
        cpu_wait_ms=result.cpu_wait_ms,
        wall_s=wall,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.planet_fidelity", description=__doc__)
    p.add_argument("--rate", type=cli.finite_float(0, 1000, low_open=True), default=20.0)
    p.add_argument("--duration", type=cli.finite_float(0, 3600, low_open=True), default=15.0)
    p.add_argument("--seed", type=cli.integer(0), default=7)
    p.add_argument("--profiles", nargs="+", default=["default", "round-robin", "nearest-region",
                                                      "least-loaded", "power-of-two"])  # fmt: skip
    p.add_argument("--sim-only", action="store_true")
    p.add_argument("--write-trace", type=cli.output_file)
    args = p.parse_args(argv)
    planned = args.rate * args.duration
    if planned > rq.MAX_PLANNED_REQUESTS:
        p.error(
            f"--rate x --duration plans {planned:,.0f} requests, more than "
            f"{rq.MAX_PLANNED_REQUESTS:,} (every one is planned before the run)"
        )
    missing = [n for n in args.profiles if not (rq.PROFILES_DIR / f"{n}.yaml").exists()]
    if missing:
        p.error(f"no such profile under {rq.PROFILES_DIR}: {', '.join(missing)}")
    asks = rq.plan(args.rate, args.duration, args.seed)
    if args.write_trace:
        lines = [json.dumps(r) for r in trace(asks, with_text=False)]
        args.write_trace.write_text("\n".join(lines) + "\n")
        print(f"wrote {len(lines)} records to {args.write_trace}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = write_trace(work / "trace.jsonl", asks)
        load = os.getloadavg()[0]
        print(
            f"hotspot fidelity: {len(asks)} requests over {args.duration:g}s, "
            f"load average {load:.2f}; calibration: {CALIBRATION_REQUESTS} requests one at a "
            f"time; compared: the requests the machine held up < {LATE_MS:g} ms"
        )
        print(
            f"{'profile':<15} {'service':>7} {'TTFT p50 sim/real':>20} {'err':>6} "
            f"{'TTFT p99 sim/real':>20} {'err':>6}  {'kr/jp/us sim':<14} {'kr/jp/us real':<14} "
            f"{'split pts':>9} {'held up':>8}"
        )
        for profile in args.profiles:
            if args.sim_only:
                t, r, n = simulate(path, args.duration, profile)
                split = "/".join(f"{100 * r[g] / max(1, n):.0f}" for g in rq.REGIONS)
                print(
                    f"{profile:<15} {'':>7} {pct(t, 0.5):>8.0f} ms {'':>17} "
                    f"{pct(t, 0.99):>8.0f} ms {'':>11} {split}"
                )
                continue
            ck = check(asks, args.duration, profile, args.seed, work)
            c = ck.comparison
            ssplit = "/".join(f"{c[f'sim_{g}']:.0f}" for g in rq.REGIONS)
            rsplit = "/".join(f"{c[f'real_{g}']:.0f}" for g in rq.REGIONS)
            print(
                f"{profile:<15} {ck.service_ms:>5.1f}ms "
                f"{c['sim_p50']:>8.0f} / {c['real_p50']:<6.0f}ms "
                f"{100 * c['p50_error']:>+5.0f}% "
                f"{c['sim_p99']:>8.0f} / {c['real_p99']:<6.0f}ms {100 * c['p99_error']:>+5.0f}%  "
                f"{ssplit:<14} {rsplit:<14} {c['split_points']:>8.1f} "
                f"{ck.late:>4}/{ck.requests}"
            )
            if ck.void:
                print(f"  void: {ck.void}")
    print("goal: within 15 % on TTFT p50 and p99, within 5 points on the region split")
    return 0


if __name__ == "__main__":
    sys.exit(main())
