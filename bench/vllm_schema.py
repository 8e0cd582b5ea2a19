"""What a JSON schema costs a request on the vLLM path: the grammar backend compiles each new
schema once (xgrammar, here) and caches it. Prints, for requests of ``--tokens`` greedy tokens
on the tiny model (services/worker/vllm/tinymodel.py, CPU settings of notes/vllm-cpu.md):

- ``plain``: no response format (the baseline of the same round);
- ``fresh schema``: a ``json_schema`` never seen before (a property name unique to the round),
  so the backend compiles it: first use;
- ``cached schema``: the same schema again: served from the backend's cache;
- ``forced tool call``: a named ``tool_choice`` (hermes parser): its structural tag, also new
  per round.

Per kind: time to the first output and end to end (median over ``--rounds``); first use minus
plain is the compile cost a request pays once per distinct schema. Prints only.

    .venv/bin/python -m bench.vllm_schema [--rounds 7] [--tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import tempfile
import time
import uuid
from contextlib import aclosing
from pathlib import Path
from typing import Any

from services.common import cli
from services.worker.engine import (
    ChatTurn,
    EngineRequest,
    ResponseFormat,
    SamplingOptions,
    ToolChoice,
    ToolSpec,
)
from services.worker.vllm.config import VllmConfig
from services.worker.vllm.engine import VllmEngine
from services.worker.vllm.tinymodel import build_tiny_model

MODEL = "tiny-llama"


def schema(tag: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            f"city_{tag}": {"type": "string", "maxLength": 8},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"enum": ["c", "f"]},
        },
        "required": [f"city_{tag}", "days", "unit"],
        "additionalProperties": False,
    }


def request(tokens: int, **over: Any) -> EngineRequest:
    return EngineRequest(
        request_id=f"bench-{uuid.uuid4().hex}",
        model=MODEL,
        messages=(ChatTurn(role="user", content="Weather in Seoul?"),),
        sampling=SamplingOptions(temperature=0.0, max_tokens=tokens),
        **over,
    )


async def timed(engine: VllmEngine, req: EngineRequest) -> tuple[float, float]:
    """(first output ms, end-to-end ms)."""
    start = time.perf_counter()
    first = 0.0
    async with aclosing(engine.generate(req)) as stream:
        async for _ in stream:
            if not first:
                first = (time.perf_counter() - start) * 1000
    return first, (time.perf_counter() - start) * 1000


async def main(args: argparse.Namespace) -> None:
    model_dir = build_tiny_model(args.model_dir)
    base = VllmConfig.cpu_test(model_dir, served_model_name=MODEL)
    config = dataclasses.replace(
        base,
        max_model_len=512,
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        structured_outputs_backend="xgrammar",
        structured_outputs_compact=True,
    )
    engine = VllmEngine(config)
    await engine.start()
    kinds = ("plain", "fresh schema", "cached schema", "forced tool call")
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    try:
        for _ in range(2):  # warm the structured-output path itself (its first use imports)
            await timed(engine, request(args.tokens, response_format=_format(uuid.uuid4().hex)))
        for _ in range(args.rounds):
            tag = uuid.uuid4().hex[:8]
            fmt = _format(tag)
            tool = ToolSpec(name=f"get_weather_{tag}", parameters=schema(tag))
            results["plain"].append(await timed(engine, request(args.tokens)))
            results["fresh schema"].append(
                await timed(engine, request(args.tokens, response_format=fmt))
            )
            results["cached schema"].append(
                await timed(engine, request(args.tokens, response_format=fmt))
            )
            results["forced tool call"].append(
                await timed(
                    engine,
                    request(
                        args.tokens,
                        tools=(tool,),
                        tool_choice=ToolChoice(mode="function", function=tool.name),
                    ),
                )
            )
    finally:
        await engine.shutdown()
    load = os.getloadavg()[0]
    print(f"vllm_schema: {args.rounds} rounds, {args.tokens} tokens, load average {load:.1f}")
    plain_first = statistics.median(r[0] for r in results["plain"])
    print(f"{'kind':<18} {'first output p50':>17} {'end to end p50':>15} {'vs plain (first)':>17}")
    for kind in kinds:
        first = statistics.median(r[0] for r in results[kind])
        total = statistics.median(r[1] for r in results[kind])
        print(f"{kind:<18} {first:>14.1f} ms {total:>12.1f} ms {first - plain_first:>+14.1f} ms")


def _format(tag: str) -> ResponseFormat:
    return ResponseFormat(type="json_schema", schema=schema(tag), name="w")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "tiny")
    parser.add_argument("--rounds", type=cli.positive_int, default=7)
    parser.add_argument("--tokens", type=cli.positive_int, default=16)
    asyncio.run(main(parser.parse_args()))
