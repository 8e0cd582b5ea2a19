"""What does Meridian's path cost an embeddings request? The same Embed workload sent (a)
straight to one simulated worker over gRPC and (b) through edge → router → worker as
``POST /v1/embeddings``, at several concurrencies, paired in one run.

    .venv/bin/python -m bench.embeddings_overhead [--concurrency 1 8] [--requests 200]
        [--inputs 4] [--chars 200]

Real processes (``LocalStack``: Redis, one simulated worker, the router, the edge), no delay
proxy. SimEngine's embedding cost is its modelled prefill (0.02 ms per token) plus the vector
arithmetic, so the direct path is nearly the worker's own floor and the difference is
Meridian's: HTTP + JSON, authentication, the rate-limit script and its settle, the Route RPC,
and rendering the vectors (floats as JSON text, or base64). Prints latency p50/p99 and
requests/s per path and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import grpc

from bench._edge import ONE_CLIENT_EDGE_ARGS
from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common import cli
from services.localstack.config import parse_stack_config
from services.localstack.stack import LocalStack

MODEL = "meridian-sim"
WORDS = [
    "the",
    "edge",
    "router",
    "worker",
    "region",
    "token",
    "cache",
    "prefix",
    "batch",
    "latency",
    "network",
    "stream",
]


def texts(n: int, chars: int, i: int) -> list[str]:
    out = []
    for k in range(n):
        words: list[str] = []
        j = i * 7 + k
        while sum(len(w) + 1 for w in words) < chars:
            words.append(WORDS[j % len(WORDS)])
            j += 3
        out.append(" ".join(words))
    return out


def pct(values: list[float], p: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


async def drive(one: object, concurrency: int, requests: int) -> tuple[list[float], float, int]:
    latencies: list[float] = []
    errors = 0
    queue = iter(range(requests))

    async def lane() -> None:
        nonlocal errors
        for i in queue:
            start = time.perf_counter()
            try:
                await one(i)  # type: ignore[operator]
            except (grpc.aio.AioRpcError, aiohttp.ClientError, RuntimeError) as err:
                errors += 1
                print(f"  error: {err}", file=sys.stderr)
                continue
            latencies.append((time.perf_counter() - start) * 1000)

    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return sorted(latencies), time.perf_counter() - start, errors


async def main(args: argparse.Namespace) -> None:
    config = parse_stack_config({"regions": {"kr": {"rtt_ms": 0, "workers": 1}}})
    stack = LocalStack(
        config=config,
        run_dir=Path(tempfile.mkdtemp(prefix="meridian-bench-")),
        edge_port=0,
        log_level="warning",
        edge_args=ONE_CLIENT_EDGE_ARGS,
    )
    await stack.start()
    url, key = stack.endpoints.edge_url, stack.endpoints.demo_key
    worker = next(iter(stack.endpoints.workers.values())).direct
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            channel = grpc.aio.insecure_channel(worker)
            stub = worker_pb2_grpc.WorkerStub(channel)

            async def direct(i: int) -> None:
                req = worker_pb2.EmbedRequest(
                    request_id=f"d-{i}-{time.monotonic_ns()}", model=MODEL
                )
                for t in texts(args.inputs, args.chars, i):
                    req.inputs.add(text=t)
                await stub.Embed(req)

            def edge(encoding: str) -> object:
                async def one(i: int) -> None:
                    body = {
                        "model": MODEL,
                        "input": texts(args.inputs, args.chars, i),
                        "encoding_format": encoding,
                    }
                    async with http.post(
                        f"{url}/v1/embeddings",
                        json=body,
                        headers={"Authorization": f"Bearer {key}"},
                    ) as resp:
                        await resp.read()
                        if resp.status != 200:
                            raise RuntimeError(f"HTTP {resp.status}")

                return one

            await drive(direct, 4, 16)  # warm both paths
            await drive(edge("float"), 4, 16)
            print(
                f"{args.inputs} inputs x ~{args.chars} chars, 256 dimensions; "
                f"{args.requests} requests per row"
            )
            print(f"{'conc':>4} {'path':>12} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'err':>4}")
            for c in args.concurrency:
                rows = {}
                for name, one in (
                    ("direct", direct),
                    ("edge float", edge("float")),
                    ("edge base64", edge("base64")),
                ):
                    lat, wall, err = await drive(one, c, args.requests)
                    rows[name] = (pct(lat, 50), pct(lat, 99), len(lat) / wall, err)
                    print(
                        f"{c:>4} {name:>12} {rows[name][0]:>8.2f} {rows[name][1]:>8.2f} "
                        f"{rows[name][2]:>8.0f} {err:>4}"
                    )
                    await asyncio.sleep(0.3)
                d = rows["direct"]
                for name in ("edge float", "edge base64"):
                    e = rows[name]
                    print(
                        f"{c:>4} {'ratio':>12} {name}: +{e[0] - d[0]:.2f} ms p50, "
                        f"{e[2] / d[2] * 100:.0f}% of direct req/s"
                    )
            await channel.close()
    finally:
        await stack.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.embeddings_overhead")
    parser.add_argument("--concurrency", type=cli.integer(1, 1024), nargs="+", default=[1, 8])
    parser.add_argument("--requests", type=cli.integer(1, 1_000_000), default=200)
    parser.add_argument("--inputs", type=cli.integer(1, 2048), default=4)
    parser.add_argument("--chars", type=cli.integer(1, 100_000), default=200)
    asyncio.run(main(parser.parse_args()))
