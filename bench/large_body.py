"""How long one large chat request holds the edge's event loop: the longest gap a 1 ms
ticker on the loop sees while the request is parsed and checked on the loop (as before) and
in the offload thread (services/edge/offload.py), in process (prints only).

    .venv/bin/python -m bench.large_body [--tools 128] [--properties 500] [--repeats 3]

The body is ``--tools`` tools of ``--properties`` string properties each (128 × 500: 3 MB,
under the default 4 MiB body limit): the shape an adversarial pass used to stall an edge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any, cast

from aiohttp import web

from services.common import cli
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.dialects.chat import CHAT
from services.edge.request_limits import RequestLimits
from services.edge.stages.validate import Validate


def body(tools: int, properties: int) -> bytes:
    schema = {
        "type": "object",
        "properties": {f"p{j}": {"type": "string", "description": "x"} for j in range(properties)},
    }
    return json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [
                {"type": "function", "function": {"name": f"t{i}", "parameters": schema}}
                for i in range(tools)
            ],
        }
    ).encode()


async def longest_gap_ms(work: Any) -> tuple[float, float]:
    """(the loop's longest gap, the work's wall time), both in ms."""
    stop = asyncio.Event()
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.02)
    start = time.perf_counter()
    await work()
    wall = time.perf_counter() - start
    await asyncio.sleep(0.02)
    stop.set()
    await ticker
    return max(gaps) * 1000, wall * 1000


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tools", type=cli.positive_int, default=128)
    p.add_argument("--properties", type=cli.positive_int, default=500)
    p.add_argument("--repeats", type=cli.positive_int, default=3)
    args = p.parse_args()
    raw = body(args.tools, args.properties)
    limits = RequestLimits(max_body_bytes=max(len(raw), 1024))
    validate = Validate(limits=limits, body_timeout_s=30.0, counters=EdgeCounters())

    def new_ctx() -> ChatContext:
        return ChatContext(request=cast(web.Request, None), request_id="chatcmpl-bench")

    async def on_loop() -> None:
        CHAT.accept(raw, new_ctx(), limits, EdgeCounters())

    async def off_loop() -> None:
        await validate._accept_off_loop(raw, new_ctx())

    print(f"body: {len(raw):,} bytes ({args.tools} tools x {args.properties} properties)")
    print(f"{'where':<15} {'longest loop gap ms':>20} {'parse wall ms':>14}")
    for name, work in (("on the loop", on_loop), ("offload thread", off_loop)):
        runs = [await longest_gap_ms(work) for _ in range(args.repeats)]
        gap = min(r[0] for r in runs)
        wall = min(r[1] for r in runs)
        print(f"{name:<15} {gap:>20.1f} {wall:>14.1f}")

    answer = big_answer()

    async def encode_on_loop() -> None:
        json.dumps(answer).encode()

    async def encode_off_loop() -> None:
        await off_loop_encode(answer)

    print(
        f"answer: {len(json.dumps(answer)):,} bytes (16 choices x 2,000 tokens x 20 top logprobs)"
    )
    print(f"{'where':<15} {'longest loop gap ms':>20} {'encode wall ms':>14}")
    for name, work in (("on the loop", encode_on_loop), ("offload thread", encode_off_loop)):
        runs = [await longest_gap_ms(work) for _ in range(args.repeats)]
        print(f"{name:<15} {min(r[0] for r in runs):>20.1f} {min(r[1] for r in runs):>14.1f}")


def big_answer() -> dict[str, Any]:
    """The shape of a non-streaming chat answer with n=16, 2,000 tokens, top_logprobs=20."""
    alt = {"token": "abc", "logprob": -1.2345, "bytes": [97, 98, 99]}
    entry = {**alt, "top_logprobs": [alt] * 20}
    return {
        "choices": [
            {
                "index": i,
                "message": {"content": "x" * 8000},
                "logprobs": {"content": [entry] * 2000},
            }
            for i in range(16)
        ]
    }


async def off_loop_encode(answer: dict[str, Any]) -> bytes:
    from services.edge.offload import json_bytes, off_loop

    return await off_loop(json_bytes, answer)


if __name__ == "__main__":
    asyncio.run(main())
