"""What does Meridian's path cost? The same streaming workload sent (a) straight to one worker
over gRPC and (b) through edge → router → worker over HTTP/SSE, at several concurrencies.

    .venv/bin/python -m bench.overhead [--concurrency 1 8 32] [--requests 64] [--tokens 64]

Real processes (``LocalStack``: Redis, one simulated worker at real speed, the router, the
edge), no delay proxy: this measures Meridian's own overhead. Prints TTFT p50/p99, inter-token
latency p50/p99 and tokens/s for both paths and their ratio (full / direct). Both paths run in
the same invocation, one after the other, so the machine's noise is shared.

Goal (issue 2): the full path adds ≤ 5 ms to TTFT p50 at concurrency 32 and keeps ≥ 95 % of
direct tokens/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc

from bench._edge import ONE_CLIENT_EDGE_ARGS
from meridian.v1 import worker_pb2, worker_pb2_grpc
from services.common import cli
from services.localstack.config import parse_stack_config
from services.localstack.stack import LocalStack

MODEL = "meridian-sim"
PROMPT = "Tell me about the weather in Seoul and how it compares to Tokyo in autumn."


@dataclass
class Sample:
    ttft_ms: float
    gaps_ms: list[float]
    tokens: int


@dataclass
class Result:
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    errors: int = 0

    def row(self) -> dict[str, float]:
        ttft = sorted(s.ttft_ms for s in self.samples)
        gaps = sorted(g for s in self.samples for g in s.gaps_ms)
        tokens = sum(s.tokens for s in self.samples)
        return {
            "ttft_p50": _pct(ttft, 50),
            "ttft_p99": _pct(ttft, 99),
            "itl_p50": _pct(gaps, 50),
            "itl_p99": _pct(gaps, 99),
            "tok_s": tokens / self.wall_s if self.wall_s else 0.0,
            "errors": float(self.errors),
        }


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


async def direct_one(stub: worker_pb2_grpc.WorkerStub, i: int, tokens: int) -> Sample:
    req = worker_pb2.GenerateRequest(request_id=f"direct-{i}-{time.monotonic_ns()}", model=MODEL)
    req.messages.add(role="user", content=PROMPT)
    req.sampling.max_tokens = tokens
    req.sampling.ignore_eos = True
    start = time.perf_counter()
    ttft = 0.0
    last = start
    gaps: list[float] = []
    n = 0
    async for chunk in stub.Generate(req):
        now = time.perf_counter()
        if chunk.text:
            if not ttft:
                ttft = (now - start) * 1000
            else:
                gaps.append((now - last) * 1000)
            last = now
        n = chunk.usage.completion_tokens
    return Sample(ttft, gaps, n)


async def edge_one(http: aiohttp.ClientSession, url: str, key: str, tokens: int) -> Sample:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft = 0.0
    last = start
    gaps: list[float] = []
    n = 0
    async with http.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            now = time.perf_counter()
            data = json.loads(line[6:])
            if data.get("usage"):
                n = data["usage"]["completion_tokens"]
            if data["choices"] and data["choices"][0]["delta"].get("content"):
                if not ttft:
                    ttft = (now - start) * 1000
                else:
                    gaps.append((now - last) * 1000)
                last = now
    return Sample(ttft, gaps, n)


async def drive(make_one: object, concurrency: int, requests: int) -> Result:
    result = Result()
    queue = iter(range(requests))

    async def lane() -> None:
        for i in queue:
            try:
                result.samples.append(await make_one(i))  # type: ignore[operator]
            except (grpc.aio.AioRpcError, aiohttp.ClientError, RuntimeError) as err:
                result.errors += 1
                print(f"  error: {err}", file=sys.stderr)

    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - start
    return result


async def main(args: argparse.Namespace) -> None:
    config = parse_stack_config(
        {
            # One region at 0 ms: no delay proxy, so this measures Meridian's own path.
            "regions": {"kr": {"rtt_ms": 0, "workers": 1}},
            "sim": {"max_num_seqs": 64},
        }
    )
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
            # Warm both paths (connections, caches).
            await drive(lambda i: direct_one(stub, i, 4), 4, 8)
            await drive(lambda i: edge_one(http, url, key, 4), 4, 8)
            print(
                f"{'conc':>4} {'path':>7} {'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} {'p99':>8} "
                f"{'tok/s':>9} {'err':>4}"
            )
            for c in args.concurrency:
                n = max(args.requests, c * 2)
                d = (await drive(lambda i: direct_one(stub, i, args.tokens), c, n)).row()
                # Let the worker's next load reports show it idle again: the router cannot see
                # the direct requests and would otherwise count them against admission.
                await asyncio.sleep(0.5)
                f = (await drive(lambda i: edge_one(http, url, key, args.tokens), c, n)).row()
                await asyncio.sleep(0.5)
                for name, r in (("direct", d), ("full", f)):
                    print(
                        f"{c:>4} {name:>7} {r['ttft_p50']:>8.2f}m {r['ttft_p99']:>7.2f}m "
                        f"{r['itl_p50']:>7.2f}m {r['itl_p99']:>7.2f}m {r['tok_s']:>9.0f} "
                        f"{int(r['errors']):>4}"
                    )
                print(
                    f"{c:>4} {'ratio':>7} +{f['ttft_p50'] - d['ttft_p50']:>6.2f}ms TTFT p50; "
                    f"tokens/s {f['tok_s'] / d['tok_s'] * 100:.1f}% of direct"
                )
            await channel.close()
    finally:
        await stack.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=cli.positive_int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=cli.positive_int, default=64)
    parser.add_argument("--tokens", type=cli.integer(2), default=64)
    asyncio.run(main(parser.parse_args()))
