"""What does mutual TLS between the services cost? Two local stacks side by side — one with
plaintext gRPC, one with ``--grpc-tls`` (every hop over mutual TLS) — driven alternately with
the same streaming workload through the edge, round after round, so both share the machine's
noise.

    .venv/bin/python -m bench.grpc_tls_overhead [--concurrency 8] [--requests 64] [--tokens 64]
                                               [--rounds 3]

Real processes (``LocalStack``: Redis, one simulated worker at real speed, the router, the
edge; no delay proxy). Prints, per stack and round, TTFT p50, tokens/s and the CPU each service
process spent per token delivered (its own /proc utime + stime over the round), then the median
ratio TLS / plaintext per service. The edge → worker token stream is the hop that carries the
load; the router's hops carry load reports and decisions.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

import aiohttp

from bench._cpu import own_cpu_seconds
from bench._edge import ONE_CLIENT_EDGE_ARGS
from bench.overhead import drive, edge_one
from services.common import cli
from services.localstack.config import parse_stack_config
from services.localstack.stack import LocalStack

SERVICES = ("edge", "router", "worker")


def _pids(stack: LocalStack) -> dict[str, int]:
    """The pid of each service's process (the one worker, the router, the edge)."""
    pids: dict[str, int] = {}
    for kind, proc in (("edge", stack.edge), ("router", stack.router)):
        assert proc is not None
        assert proc.pid is not None
        pids[kind] = proc.pid
    (worker,) = stack.workers.values()
    assert worker.pid is not None
    pids["worker"] = worker.pid
    return pids


async def _round(
    stack: LocalStack, http: aiohttp.ClientSession, args: argparse.Namespace
) -> dict[str, float]:
    url, key = stack.endpoints.edge_url, stack.endpoints.demo_key
    pids = _pids(stack)
    before = {k: own_cpu_seconds(p) for k, p in pids.items()}
    n = max(args.requests, args.concurrency * 2)
    result = await drive(lambda i: edge_one(http, url, key, args.tokens), args.concurrency, n)
    after = {k: own_cpu_seconds(p) for k, p in pids.items()}
    tokens = sum(s.tokens for s in result.samples) or 1
    row = result.row()
    out = {f"{k}_us": (after[k] - before[k]) / tokens * 1e6 for k in SERVICES}
    out.update(ttft_p50=row["ttft_p50"], tok_s=row["tok_s"], errors=row["errors"])
    return out


async def main(args: argparse.Namespace) -> None:
    config = parse_stack_config(
        {"regions": {"kr": {"rtt_ms": 0, "workers": 1}}, "sim": {"max_num_seqs": 64}}
    )
    stacks = {
        name: LocalStack(
            config=config,
            run_dir=Path(tempfile.mkdtemp(prefix=f"meridian-bench-{name}-")),
            edge_port=0,
            log_level="warning",
            edge_args=ONE_CLIENT_EDGE_ARGS,
            grpc_tls=name == "mtls",
        )
        for name in ("plain", "mtls")
    }
    try:
        for stack in stacks.values():
            await stack.start()
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in stacks}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            for stack in stacks.values():  # warm-up: connections, caches
                await drive(
                    lambda i, s=stack: edge_one(
                        http, s.endpoints.edge_url, s.endpoints.demo_key, 4
                    ),
                    4,
                    8,
                )
            print(
                f"{'round':>5} {'stack':>6} {'TTFT p50':>9} {'tok/s':>7} {'err':>4} "
                + " ".join(f"{k + ' µs/tok':>14}" for k in SERVICES)
            )
            for r in range(args.rounds):
                order = list(stacks) if r % 2 == 0 else list(reversed(stacks))
                for name in order:
                    row = await _round(stacks[name], http, args)
                    rows[name].append(row)
                    print(
                        f"{r + 1:>5} {name:>6} {row['ttft_p50']:>8.2f}m {row['tok_s']:>7.0f} "
                        f"{int(row['errors']):>4} "
                        + " ".join(f"{row[k + '_us']:>14.1f}" for k in SERVICES)
                    )
                    await asyncio.sleep(0.5)  # the worker's load reports show it idle again
        print("median TLS / plaintext over the rounds:")
        for k in (*(f"{s}_us" for s in SERVICES), "ttft_p50", "tok_s"):
            ratios = [
                m[k] / p[k] for m, p in zip(rows["mtls"], rows["plain"], strict=True) if p[k] > 0
            ]
            if ratios:
                print(f"  {k:<10} {statistics.median(ratios):.3f}×")
    finally:
        for stack in stacks.values():
            await stack.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=cli.positive_int, default=8)
    parser.add_argument("--requests", type=cli.positive_int, default=64)
    parser.add_argument("--tokens", type=cli.integer(2), default=64)
    parser.add_argument("--rounds", type=cli.positive_int, default=3)
    asyncio.run(main(parser.parse_args()))
