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
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvloop

from bench import routing_quality as rq
from services.edge.openai_types import ChatCompletionRequest
from services.edge.prompt import BLOCK_CHARS, prefix_hashes
from services.planet.scenario import build
from services.planet.sim import Planet
from services.worker.engine import ChatTurn
from services.worker.sim.text import render_chat, tokenize

ROOT = Path(__file__).resolve().parents[1]
# What the real stack costs around a decision that the network model does not: the Route RPC
# on loopback (~1 ms, bench/README.md router_rpc) plus the Generate call's own set-up.
ROUTE_MS = 1.5


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
    trace_path: Path, duration_s: float, profile: str, engine: str = "exact"
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


def simulate(
    trace_path: Path, duration_s: float, profile: str
) -> tuple[list[float], Counter[str], int]:
    sc = build(scenario(trace_path, duration_s, profile), source="hotspot", base=ROOT)
    planet = Planet(sc, record=True)
    planet.run()
    records = planet.records or []
    return [t for t, _ in records], Counter(r for _, r in records), planet.requests


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.planet_fidelity", description=__doc__)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--profiles", nargs="+", default=["default", "round-robin", "nearest-region",
                                                      "least-loaded", "power-of-two"])  # fmt: skip
    p.add_argument("--sim-only", action="store_true")
    p.add_argument("--write-trace", type=Path)
    args = p.parse_args(argv)
    if not args.rate > 0 or not args.duration > 0:
        p.error("--rate and --duration must be > 0")
    asks = rq.plan(args.rate, args.duration, args.seed)
    if args.write_trace:
        lines = [json.dumps(r) for r in trace(asks, with_text=False)]
        args.write_trace.write_text("\n".join(lines) + "\n")
        print(f"wrote {len(lines)} records to {args.write_trace}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in trace(asks, with_text=True)) + "\n")
        load = os.getloadavg()[0]
        print(
            f"hotspot fidelity: {len(asks)} requests over {args.duration:g}s, "
            f"load average {load:.2f}"
        )
        print(
            f"{'profile':<15} {'TTFT p50 sim/real':>20} {'err':>6} {'TTFT p99 sim/real':>20} "
            f"{'err':>6}  {'kr/jp/us sim':<14} {'kr/jp/us real':<14} {'split pts':>9}"
        )
        for profile in args.profiles:
            sim = simulate(path, args.duration, profile)
            if args.sim_only:
                t, r, n = sim
                split = "/".join(f"{100 * r[g] / max(1, n):.0f}" for g in rq.REGIONS)
                print(
                    f"{profile:<15} {pct(t, 0.5):>8.0f} ms {'':>17} "
                    f"{pct(t, 0.99):>8.0f} ms {'':>11} {split}"
                )
                continue
            c = compare(sim, real(asks, profile, args.seed))
            ssplit = "/".join(f"{c[f'sim_{g}']:.0f}" for g in rq.REGIONS)
            rsplit = "/".join(f"{c[f'real_{g}']:.0f}" for g in rq.REGIONS)
            print(
                f"{profile:<15} {c['sim_p50']:>8.0f} / {c['real_p50']:<6.0f}ms "
                f"{100 * c['p50_error']:>+5.0f}% "
                f"{c['sim_p99']:>8.0f} / {c['real_p99']:<6.0f}ms {100 * c['p99_error']:>+5.0f}%  "
                f"{ssplit:<14} {rsplit:<14} {c['split_points']:>8.1f}"
            )
    print("goal: within 15 % on TTFT p50 and p99, within 5 points on the region split")
    return 0


if __name__ == "__main__":
    sys.exit(main())
