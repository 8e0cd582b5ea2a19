"""The real vLLM engine on this machine: start time, TTFT, tokens/s, abort latency (prints only).

Runs ``VllmEngine`` on the tiny random Llama (services/worker/vllm/tinymodel.py) with the CPU
settings of notes/vllm-cpu.md, so the figures describe the serving path on a small CPU host
(scheduler, detokenizer, streaming, our wrapper), not a model's speed on a GPU. For each
concurrency level it sends that many greedy requests of ``--tokens`` tokens (``ignore_eos``)
at once and prints time to first token (as the caller sees it, and the engine's own
queue + prefill), end-to-end time and generated tokens/s. Then it cancels a batch mid-stream
and prints how long the engine took to report no running request.

    .venv/bin/python -m bench.vllm_engine [--model-dir DIR] [--concurrency 1,4,8,16] [--tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from contextlib import aclosing
from pathlib import Path

from services.common import cli
from services.worker.engine import ChatTurn, EngineRequest, SamplingOptions
from services.worker.vllm.config import VllmConfig
from services.worker.vllm.engine import VllmEngine
from services.worker.vllm.tinymodel import build_tiny_model

MODEL = "tiny-llama"


def request(tokens: int, content: str = "Tell me about the edge.") -> EngineRequest:
    return EngineRequest(
        request_id=f"bench-{uuid.uuid4().hex}",
        model=MODEL,
        messages=(ChatTurn(role="user", content=content),),
        sampling=SamplingOptions(temperature=0.0, max_tokens=tokens, ignore_eos=True),
    )


async def one(engine: VllmEngine, tokens: int) -> tuple[float, float, float, int]:
    """(client TTFT ms, engine queue+prefill ms, end-to-end ms, tokens) of one request."""
    start = time.perf_counter()
    ttft = engine_ttft = 0.0
    count = 0
    async with aclosing(engine.generate(request(tokens))) as stream:
        async for output in stream:
            if count == 0:
                ttft = (time.perf_counter() - start) * 1000
                engine_ttft = (output.queue_ms or 0.0) + (output.prefill_ms or 0.0)
            count = output.completion_tokens
    return ttft, engine_ttft, (time.perf_counter() - start) * 1000, count


async def level(engine: VllmEngine, concurrency: int, tokens: int, rounds: int) -> None:
    ttfts: list[float] = []
    engine_ttfts: list[float] = []
    e2es: list[float] = []
    generated = 0
    wall = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        results = await asyncio.gather(*(one(engine, tokens) for _ in range(concurrency)))
        wall += time.perf_counter() - start
        for ttft, engine_ttft, e2e, count in results:
            ttfts.append(ttft)
            engine_ttfts.append(engine_ttft)
            e2es.append(e2e)
            generated += count
    print(
        f"{concurrency:>5} {statistics.median(ttfts):>10.1f} {max(ttfts):>9.1f} "
        f"{statistics.median(engine_ttfts):>11.1f} {statistics.median(e2es):>9.1f} "
        f"{generated / wall:>10.0f}"
    )


async def abort_latency(engine: VllmEngine, concurrency: int) -> float:
    started = [asyncio.Event() for _ in range(concurrency)]

    async def consume(first: asyncio.Event) -> None:
        async with aclosing(engine.generate(request(200))) as stream:
            async for _ in stream:
                first.set()

    tasks = [asyncio.create_task(consume(e)) for e in started]
    await asyncio.gather(*(e.wait() for e in started))
    cancelled = time.perf_counter()
    for task in tasks:
        task.cancel()
    while engine.load().running:  # noqa: ASYNC110  # load() is polled, as the server does
        await asyncio.sleep(0.0005)
    elapsed = (time.perf_counter() - cancelled) * 1000
    await asyncio.gather(*tasks, return_exceptions=True)
    return elapsed


async def main(args: argparse.Namespace) -> None:
    model_dir = build_tiny_model(args.model_dir)
    engine = VllmEngine(VllmConfig.cpu_test(model_dir, served_model_name=MODEL))
    start = time.perf_counter()
    await engine.start()
    print(f"engine start (incl. warm-up): {time.perf_counter() - start:.1f} s")
    try:
        print(f"\n{args.tokens} tokens per request, greedy, {args.rounds} rounds per level")
        print("conc. ttft_p50ms ttft_maxms engine_ttft e2e_p50ms  tokens/s")
        for concurrency in args.concurrency:
            await level(engine, concurrency, args.tokens, args.rounds)
        latencies = [await abort_latency(engine, 8) for _ in range(5)]
        print(
            "\ncancel 8 streams -> engine running 0: "
            + ", ".join(f"{ms:.1f}" for ms in latencies)
            + " ms"
        )
        print(f"load after the runs: {engine.load()}")
    finally:
        await engine.shutdown()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.vllm_engine", description=__doc__)
    p.add_argument(
        "--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "meridian-tiny-llama"
    )
    p.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8, 16]
    )
    p.add_argument("--tokens", type=cli.positive_int, default=32)
    p.add_argument("--rounds", type=cli.positive_int, default=3)
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
