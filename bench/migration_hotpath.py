"""What mid-stream migration costs a stream that never fails: the per-chunk bookkeeping.

    .venv/bin/python -m bench.migration_hotpath [--chunks 100000] [--rounds 5]

A stream that never breaks pays, per chunk, one more async-generator hop
(``MigratingStream.chunks`` around ``UpstreamStream.chunks``) and ``Delivered.add`` (a list
append; the counts are folded only when a migration asks). This times both against the bare
generator, in the same run, over the same protobuf chunks, and prints ns per chunk (median of
the rounds). Compare with the edge's ~130 µs of CPU per relayed token (bench/README.md,
overhead): the end-to-end ``bench.overhead`` cannot resolve a difference this size on these
machines.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator

from meridian.v1 import worker_pb2
from services.common import cli
from services.edge.migration.resume import Delivered


async def _bare(chunks: list[worker_pb2.GenerateChunk]) -> AsyncIterator[worker_pb2.GenerateChunk]:
    for c in chunks:
        yield c


async def _driven(
    chunks: list[worker_pb2.GenerateChunk], delivered: Delivered
) -> AsyncIterator[worker_pb2.GenerateChunk]:
    """The shape of MigratingStream.chunks on a stream that never breaks."""
    async for c in _bare(chunks):
        if c.finish_reason == worker_pb2.FINISH_REASON_ABORT:
            raise RuntimeError("unreachable")
        delivered.add(c)
        yield c


async def amain(n: int, rounds: int) -> None:
    chunks = [worker_pb2.GenerateChunk(text=" word", token_ids=[i]) for i in range(n)]
    bare: list[float] = []
    driven: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        async for _c in _bare(chunks):
            pass
        t1 = time.perf_counter()
        async for _c in _driven(chunks, Delivered()):
            pass
        t2 = time.perf_counter()
        bare.append((t1 - t0) / n * 1e9)
        driven.append((t2 - t1) / n * 1e9)
    b, d = statistics.median(bare), statistics.median(driven)
    print(f"bare generator      {b:7.0f} ns/chunk")
    print(f"migration-ready     {d:7.0f} ns/chunk")
    print(
        f"added per chunk     {d - b:7.0f} ns  ({(d - b) / 130_000:.2%} of ~130 µs edge CPU/token)"
    )


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.migration_hotpath")
    p.add_argument("--chunks", type=cli.positive_int, default=100_000)
    p.add_argument("--rounds", type=cli.positive_int, default=5)
    args = p.parse_args()
    asyncio.run(amain(args.chunks, args.rounds))


if __name__ == "__main__":
    main()
