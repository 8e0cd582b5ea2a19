"""What do traces and metrics cost the edge? Throughput of the full path with telemetry
disabled (the SDK off: no-op tracer and meter), with tracing off but metrics on, and with
tracing on but sampling nothing (the machinery alone), sampled at 5 % (what production would
run) and at 100 %, exporting OTLP to a live receiver.

    .venv/bin/python -m bench.telemetry_overhead [--requests 600] [--concurrency 16] [--rounds 3]

Each mode starts its own stack (Redis, one simulated worker at 1/100 of real speed so the edge
is the bottleneck, the router, the edge), runs the same non-streaming workload, and the modes
are interleaved over several rounds so the machine's noise is shared. Prints requests/s per
mode (best of the rounds) and the cost relative to the disabled baseline.

Goal (issue 6): tracing at 100 % costs ≤ 10 % of edge throughput; off, ≤ 1 %.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.trace import SpanKind

from bench._edge import ONE_CLIENT_EDGE_ARGS
from services.common.tracecontext import extract_headers, inject_metadata
from services.localstack.config import parse_stack_config
from services.localstack.stack import LocalStack

MODES: dict[str, dict[str, str]] = {
    "disabled": {"OTEL_SDK_DISABLED": "true"},
    "metrics only": {"OTEL_TRACES_SAMPLER": "always_off"},
    "traces 0%": {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0",
    },
    "traces 5%": {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.05",
    },
    "traces 100%": {"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
    "diag no export": {
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_TRACES_EXPORTER": "none",
    },
    "diag edge only": {"OTEL_TRACES_SAMPLER": "parentbased_always_on", "DIAG_EDGE_ONLY": "1"},
    "diag edge only no export": {
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "DIAG_EDGE_ONLY": "1",
        "OTEL_TRACES_EXPORTER": "none",
    },
    "traces 100% sdk": {"OTEL_TRACES_SAMPLER": "parentbased_always_on", "MERIDIAN_TRACER": "sdk"},
}


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    """Accepts OTLP spans and counts them (what a collector costs the sender)."""

    def __init__(self) -> None:
        self.spans = 0

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc), immune to other load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_mode(
    env: dict[str, str], args: argparse.Namespace, endpoint: str
) -> tuple[float, float]:
    """(requests/s, edge CPU µs per request)."""
    saved = dict(os.environ)
    os.environ.update(env)
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    os.environ["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
    config = parse_stack_config(
        {
            "regions": {"kr": {"rtt_ms": 0, "workers": 1}},
            "sim": {"time_scale": 0.01, "output_len_min": 8, "output_len_max": 8},
        }
    )
    run_dir = Path(tempfile.mkdtemp(prefix="meridian-otel-bench-"))
    stack = LocalStack(
        config=config,
        run_dir=run_dir,
        edge_port=0,
        log_level="warning",
        edge_args=ONE_CLIENT_EDGE_ARGS,
    )
    try:
        await stack.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    url = f"{stack.endpoints.edge_url}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {stack.endpoints.demo_key}"}
    body = {
        "model": stack.endpoints.model,
        "messages": [{"role": "user", "content": "How fast is the edge?"}],
        "max_tokens": 8,
    }
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=args.concurrency)
        ) as http:

            async def one() -> None:
                async with http.post(url, json=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")

            for _ in range(20):
                await one()
            assert stack.edge is not None
            assert stack.edge.pid is not None
            if args.rate:
                await paced(one, args.rate, min(args.requests, int(args.rate) * 2))  # warm
            cpu0 = cpu_seconds(stack.edge.pid)
            start = time.perf_counter()
            if args.rate:
                await paced(one, args.rate, args.requests)
            else:
                queue = iter(range(args.requests))

                async def lane() -> None:
                    for _ in queue:
                        await one()

                await asyncio.gather(*(lane() for _ in range(args.concurrency)))
            wall = time.perf_counter() - start
            cpu_us = (cpu_seconds(stack.edge.pid) - cpu0) / args.requests * 1e6
            return args.requests / wall, cpu_us
    finally:
        await stack.stop()


async def paced(one: Callable[[], Awaitable[None]], rate: float, n: int) -> None:
    """``n`` requests arriving at ``rate`` per second (open loop: a slow answer does not delay
    the next arrival), so every mode does the same work per second."""
    start = time.perf_counter()
    tasks = []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)


def tracing_off_us(n: int = 20_000) -> float:
    """µs per request of the tracing calls the edge still makes with tracing off (a no-op
    tracer): the request span, two ``traceparent`` injections and the unsampled attempt."""
    tracer = trace.NoOpTracer()
    headers = {"content-type": "application/json", "authorization": "Bearer x"}

    def one() -> None:
        parent = extract_headers(headers)
        with tracer.start_as_current_span(
            "POST /v1/chat/completions", context=parent, kind=SpanKind.SERVER
        ) as span:
            if span.get_span_context().is_valid:
                raise AssertionError("a no-op tracer made a valid span")
            inject_metadata()
            request_span = trace.get_current_span()
            attempt = trace.NonRecordingSpan(request_span.get_span_context())
            inject_metadata(trace.set_span_in_context(attempt))
            span.set_attribute("http.response.status_code", 200)

    for _ in range(n // 10):
        one()
    start = time.perf_counter()
    for _ in range(n):
        one()
    return (time.perf_counter() - start) / n * 1e6


async def main(args: argparse.Namespace) -> None:
    sink = Sink()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    modes = {m: MODES[m] for m in args.modes}
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for rnd in range(args.rounds):
        for mode, env in modes.items():
            rps, cpu_us = await run_mode(env, args, f"http://127.0.0.1:{port}")
            results[mode].append((rps, cpu_us))
            print(
                f"round {rnd + 1} {mode:<13} {rps:8.0f} req/s  edge CPU {cpu_us:7.0f} µs/req",
                file=sys.stderr,
                flush=True,
            )
    await server.stop(0)
    del server
    if "disabled" not in results:
        raise SystemExit("the 'disabled' mode is the baseline: include it in --modes")
    base_rps = max(r for r, _ in results["disabled"])
    base_cpu = min(c for _, c in results["disabled"])
    print(
        f"\n{'mode':<14} {'req/s':>8} {'edge CPU µs/req':>16} {'req/s per edge core':>20} "
        f"{'throughput cost':>16}"
    )
    for mode, values in results.items():
        rps = max(r for r, _ in values)
        cpu = min(c for _, c in values)
        print(
            f"{mode:<14} {rps:>8.0f} {cpu:>16.0f} {1e6 / cpu:>20.0f} "
            f"{(1 - base_cpu / cpu) * 100:>15.1f}%"
        )
    print(
        "\n(throughput cost = share of edge capacity lost, from CPU per request: "
        f"best-of-rounds; disabled baseline {base_rps:.0f} req/s)"
    )
    print(f"\nspans received by the OTLP sink: {sink.spans}")
    off = tracing_off_us()
    print(
        f"tracing off (no-op tracer), timed in isolation: {off:.1f} µs/request "
        f"= {off / base_cpu * 100:.1f} % of the disabled baseline's edge CPU"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="send requests at this fixed rate (req/s, open loop) instead of --concurrency "
        "closed loops: edge CPU per request at the same load in every mode, the machine not "
        "saturated (default: 0, closed loops)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=list(MODES),
        default=list(MODES),
        metavar="MODE",
        help=f"which modes to run (default: all of {list(MODES)}); 'disabled' is the baseline",
    )
    asyncio.run(main(parser.parse_args()))
