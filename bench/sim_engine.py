"""How the simulated engine behaves under a rising request rate (prints figures, asserts nothing).

Drives the pure ``SimScheduler`` on simulated time (no sleeping, so a minute of traffic takes
seconds): Poisson arrivals at each rate, prompts of 200-2,000 tokens of which a share start
with the same 1,000-token system prompt (prefix-cache hits), natural output lengths from the
config. For each rate it prints time to first token (p50/p95), time per output token, the
generated tokens/s, the mean batch and queue, KV use, preemptions and the prefix-cache hit rate
— the curve the router's scoring has to read from load reports.

    .venv/bin/python -m bench.sim_engine [--seconds 60] [--rates 2,5,10,20,40]
"""

from __future__ import annotations

import argparse
import random
import statistics

from services.common import cli
from services.worker.engine import ChatTurn, EngineRequest, SamplingOptions
from services.worker.sim.config import SimConfig
from services.worker.sim.scheduler import SimScheduler

_VOCAB = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")
SYSTEM = " ".join(_VOCAB[i % 7] for i in range(1000))


def make_request(i: int, rng: random.Random, shared_fraction: float) -> EngineRequest:
    body = " ".join(rng.choice(_VOCAB) for _ in range(rng.randint(200, 2000)))
    turns = [ChatTurn(role="user", content=body)]
    if rng.random() < shared_fraction:
        turns.insert(0, ChatTurn(role="system", content=SYSTEM))
    return EngineRequest(
        request_id=f"r{i}",
        model="meridian-sim",
        messages=tuple(turns),
        sampling=SamplingOptions(seed=i),
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def simulate(rate: float, seconds: float, config: SimConfig, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    s = SimScheduler(config)
    arrivals: list[float] = []
    t = 0.0
    while (t := t + rng.expovariate(rate)) < seconds:
        arrivals.append(t)
    requests = [make_request(i, rng, 0.5) for i in range(len(arrivals))]
    arrived_at: dict[str, float] = {}
    first: dict[str, float] = {}
    done: dict[str, tuple[float, int]] = {}
    now, nxt = 0.0, 0
    preemptions = 0
    batch: list[int] = []
    queue: list[int] = []
    kv: list[float] = []
    hit_rates: list[float] = []
    generated = 0
    while nxt < len(arrivals) or s.num_running or s.num_waiting:
        while nxt < len(arrivals) and arrivals[nxt] <= now:
            s.add(requests[nxt], arrivals[nxt])
            arrived_at[requests[nxt].request_id] = arrivals[nxt]
            nxt += 1
        result = s.step(now)
        if result is None:
            now = arrivals[nxt]
            continue
        now = result.finished_at
        preemptions += len(result.plan.preempted)
        load = s.load(now)
        batch.append(result.plan.batch_size)
        queue.append(load.waiting)
        kv.append(load.kv_cache_usage)
        hit_rates.append(load.prefix_cache_hit_rate)
        for rid, out in result.outputs.items():
            generated += len(out.token_ids)
            first.setdefault(rid, now)
            if out.finish_reason is not None:
                done[rid] = (now, out.completion_tokens)
    ttft = [first[r] - arrived_at[r] for r in first]
    tpot = [(end - first[r]) / (n - 1) for r, (end, n) in done.items() if n > 1]
    return {
        "requests": len(arrivals),
        "ttft_p50_ms": percentile(ttft, 0.5) * 1e3,
        "ttft_p95_ms": percentile(ttft, 0.95) * 1e3,
        "tpot_ms": statistics.fmean(tpot) * 1e3 if tpot else float("nan"),
        "tok_per_s": generated / now if now else 0.0,
        "batch": statistics.fmean(batch) if batch else 0.0,
        "waiting": statistics.fmean(queue) if queue else 0.0,
        "kv_max": max(kv, default=0.0),
        "preempt": preemptions,
        "hit_rate": statistics.fmean(hit_rates) if hit_rates else 0.0,
    }


def _rates(value: str) -> list[float]:
    """``--rates``: a comma list of request rates, each > 0 and at most 10,000/s."""
    one = cli.finite_float(0, 10_000, low_open=True)
    return [one(r.strip()) for r in value.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--seconds",
        type=cli.finite_float(0, 86_400, low_open=True),
        default=60.0,
        help="simulated seconds of traffic",
    )
    parser.add_argument(
        "--rates",
        type=_rates,
        default=_rates("2,5,10,20,40"),
        help="request rates (req/s), comma list",
    )
    parser.add_argument("--seed", type=cli.integer(0), default=1)
    args = parser.parse_args()
    config = SimConfig()
    print(f"SimConfig defaults; {args.seconds:g} s of Poisson traffic per rate")
    header = (
        f"{'req/s':>6} {'reqs':>5} {'ttft p50':>9} {'ttft p95':>9} {'tpot':>6} {'tok/s':>7} "
        f"{'batch':>6} {'queue':>6} {'kv max':>6} {'preempt':>7} {'hits':>5}"
    )
    print(header)
    for rate in args.rates:
        m = simulate(rate, args.seconds, config, args.seed)
        print(
            f"{rate:>6g} {m['requests']:>5.0f} {m['ttft_p50_ms']:>7.0f}ms"
            f" {m['ttft_p95_ms']:>7.0f}ms {m['tpot_ms']:>4.1f}ms {m['tok_per_s']:>7.0f}"
            f" {m['batch']:>6.1f} {m['waiting']:>6.1f} {m['kv_max']:>6.2f}"
            f" {m['preempt']:>7.0f} {m['hit_rate']:>5.2f}"
        )


if __name__ == "__main__":
    main()
