"""What do traces and metrics cost the edge? Edge CPU per request on the full path with
telemetry disabled (the SDK off: no-op tracer and meter), with tracing off but metrics on,
with tracing on but sampling nothing (the machinery alone), sampled at 5 % (what production
would run) and at 100 % — with the lean tracer (default) and with the OpenTelemetry SDK's
(``MERIDIAN_TRACER=sdk``) — exporting OTLP to a live receiver.

    .venv/bin/python -m bench.telemetry_overhead [--requests 500] [--rounds 8] [--modes ...]

One stack per mode (Redis, one simulated worker at 1/100 of real speed so the edge is the
bottleneck, the router, the edge), all started up front. Then, round after round, each stack
gets the same burst of non-streaming requests (``--concurrency`` closed loops, or a fixed
``--rate``), in a rotating order. These 2-core VMs drift by ±15 % from one minute to the next,
more than the effects measured here, so the figures that count are *paired*: within a round,
each mode's edge CPU per request over its baseline's, measured seconds apart; the median over
the rounds is printed with its spread. Asserts nothing.

Goal (issue 6): tracing at 100 % costs ≤ 10 % of edge throughput (throughput lost = 1 − CPU
per request with tracing off / with it on); off, ≤ 1 %.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    ReadableSpan,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

from bench._edge import ONE_CLIENT_EDGE_ARGS
from services.common import cli
from services.common.tracecontext import extract_headers, inject_metadata
from services.common.tracing.otlp_wire import encode_export_request
from services.common.tracing.tracer import LeanTracer
from services.localstack.config import parse_stack_config
from services.localstack.stack import LocalStack

_TRACES_100 = {"OTEL_TRACES_SAMPLER": "parentbased_always_on"}
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
    "traces 100%": _TRACES_100,
    "traces 100% no export": {**_TRACES_100, "OTEL_TRACES_EXPORTER": "none"},
    "traces 100% sdk": {**_TRACES_100, "MERIDIAN_TRACER": "sdk"},
    # The edge traces everything; the router and worker trace nothing. On this 2-core machine
    # their extra tracing work shares the edge's cores and caches: this separates the two.
    "traces 100% edge only": _TRACES_100,
}
#: Extra environment per kind of service, for the modes that need it.
SERVICE_ENV: dict[str, dict[str, dict[str, str]]] = {
    "traces 100% edge only": {
        "router": {"OTEL_TRACES_SAMPLER": "always_off"},
        "worker": {"OTEL_TRACES_SAMPLER": "always_off"},
    },
}
#: What each mode is compared with: tracing modes with tracing off (metrics stay on in both).
BASELINE: dict[str, str] = {
    "disabled": "disabled",
    "metrics only": "disabled",
    **{m: "metrics only" for m in MODES if m.startswith("traces")},
}
DEFAULT_MODES = ["disabled", "metrics only", "traces 5%", "traces 100%", "traces 100% sdk"]


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


async def start_stack(
    env: dict[str, str], endpoint: str, service_env: dict[str, dict[str, str]]
) -> LocalStack:
    """A stack whose processes see ``env`` (each mode is a set of environment variables)."""
    saved = dict(os.environ)
    os.environ.update(env)
    # Traces go by OTLP to the sink; metrics stay on each service's Prometheus endpoint (the
    # usual split: a collector for traces, a Prometheus server scraping metrics).
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
    os.environ["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
    config = parse_stack_config(
        {
            "regions": {"kr": {"rtt_ms": 0, "workers": 1}},
            "sim": {"time_scale": 0.01, "output_len_min": 8, "output_len_max": 8},
        }
    )
    stack = LocalStack(
        config=config,
        run_dir=Path(tempfile.mkdtemp(prefix="meridian-otel-bench-")),
        edge_port=0,
        log_level="warning",
        edge_args=ONE_CLIENT_EDGE_ARGS,
        service_env=service_env,
    )
    try:
        await stack.start()
    except BaseException:
        await stack.stop()
        raise
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return stack


class Load:
    """The same non-streaming chat request, sent to one stack's edge."""

    def __init__(self, stack: LocalStack, http: aiohttp.ClientSession) -> None:
        self.url = f"{stack.endpoints.edge_url}/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {stack.endpoints.demo_key}"}
        self.body = {
            "model": stack.endpoints.model,
            "messages": [{"role": "user", "content": "How fast is the edge?"}],
            "max_tokens": 8,
        }
        self.http = http
        assert stack.edge is not None
        assert stack.edge.pid is not None
        self.edge_pid = stack.edge.pid
        assert stack.router is not None
        assert stack.router.pid is not None
        # The rest of the path, for the record: router and worker CPU per request.
        self.others = [stack.router.pid, *(w.pid for w in stack.workers.values() if w.pid)]
        self.others_us: list[float] = []

    async def one(self) -> None:
        async with self.http.post(self.url, json=self.body, headers=self.headers) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")

    async def burst(self, args: argparse.Namespace, n: int) -> tuple[float, float]:
        """(requests/s, edge CPU µs per request) over ``n`` requests."""
        cpu0 = cpu_seconds(self.edge_pid)
        others0 = sum(cpu_seconds(pid) for pid in self.others)
        start = time.perf_counter()
        if args.rate:
            await paced(self.one, args.rate, n)
        else:
            queue = iter(range(n))

            async def lane() -> None:
                for _ in queue:
                    await self.one()

            await asyncio.gather(*(lane() for _ in range(args.concurrency)))
        wall = time.perf_counter() - start
        others = sum(cpu_seconds(pid) for pid in self.others) - others0
        self.others_us.append(others / n * 1e6)
        return n / wall, (cpu_seconds(self.edge_pid) - cpu0) / n * 1e6


async def paced(one: Callable[[], Coroutine[Any, Any, None]], rate: float, n: int) -> None:
    """``n`` requests arriving at ``rate`` per second (open loop: a slow answer does not delay
    the next arrival), so every mode does the same work per second."""
    start = time.perf_counter()
    tasks: list[asyncio.Task[None]] = []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)


class InlineBatches(SpanProcessor):
    """Collects ended spans and encodes each 512 as its exporter would, in the caller's thread,
    then drops the bytes: the whole span path, no network, no queue that could drop spans."""

    def __init__(self, encode: Callable[[Sequence[ReadableSpan]], bytes]) -> None:
        self.encode = encode
        self.batch: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.batch.append(span)
        if len(self.batch) >= 512:
            self.force_flush()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self.batch:
            self.encode(self.batch)
            self.batch = []
        return True


def edge_tracing(tracer: trace.Tracer) -> Callable[[], None]:
    """The tracing calls the edge makes for one request, in order: the request span from the
    client's headers, three stage spans (auth, admission, route) made current in turn, the
    router's and the worker's ``traceparent``, the attempt span with its first-token event."""
    headers = {"content-type": "application/json", "authorization": "Bearer x"}

    def stage(name: str) -> None:
        parent = otel_context.get_current()
        span = tracer.start_span(name, context=parent)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        if name == "edge.route":
            inject_metadata()
        span.end()
        otel_context.detach(token)

    def one() -> None:
        parent = extract_headers(headers)
        with tracer.start_as_current_span(
            "POST /v1/chat/completions",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": "POST", "url.path": "/v1/chat/completions"},
        ) as span:
            format(span.get_span_context().trace_id, "032x")
            for name in ("edge.authenticate", "edge.admit", "edge.route"):
                stage(name)
            if span.is_recording():
                attempt = tracer.start_span(
                    "edge.attempt",
                    kind=SpanKind.CLIENT,
                    attributes={
                        "meridian.worker": "kr-0",
                        "meridian.region": "kr",
                        "meridian.attempt": 1,
                        "server.address": "127.0.0.1:50051",
                    },
                )
            else:
                attempt = trace.NonRecordingSpan(span.get_span_context())
            inject_metadata(trace.set_span_in_context(attempt))
            attempt.add_event("first_token", {"meridian.ttft_ms": 12.5})
            attempt.set_attribute("gen_ai.usage.output_tokens", 8)
            attempt.set_attribute("meridian.outcome", "OUTCOME_OK")
            attempt.end()
            span.set_attribute("http.response.status_code", 200)

    return one


def isolated_tracers() -> dict[str, tuple[trace.Tracer, Callable[[], object]]]:
    """The edge's tracer as each implementation builds it, exporting to an encoding sink:
    {name: (tracer, flush)}."""
    resource = Resource.create({"service.name": "meridian-edge"})
    sampler = ParentBased(ALWAYS_ON)
    lean_processor = InlineBatches(encode_export_request)
    multi = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
    multi.add_span_processor(lean_processor)
    lean = LeanTracer(
        resource=resource,
        sampler=sampler,
        processor=multi,
        scope=InstrumentationScope("meridian.edge"),
    )
    provider = TracerProvider(resource=resource, sampler=sampler)
    sdk_processor = InlineBatches(lambda s: encode_spans(s).SerializeToString())
    provider.add_span_processor(sdk_processor)
    return {
        "off (no-op)": (trace.NoOpTracer(), lambda: None),
        "100 % lean": (lean, lean_processor.force_flush),
        "100 % sdk": (provider.get_tracer("meridian.edge"), sdk_processor.force_flush),
    }


def isolated_us(tracer: trace.Tracer, flush: Callable[[], object], n: int = 20_000) -> float:
    """µs per request of :func:`edge_tracing`, encoding included (best of 3)."""
    one = edge_tracing(tracer)
    for _ in range(n // 10):
        one()
    flush()
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for _ in range(n):
            one()
        flush()
        best = min(best, (time.process_time() - start) / n * 1e6)
    return best


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def print_isolated(base_cpu: float | None) -> None:
    print(
        "\nThe edge's tracing calls for one request, timed in isolation (one process, CPU time, "
        "encoding included, best of 3)"
        + (
            f";\nshare of the baseline's median edge CPU per request ({base_cpu:.0f} µs):"
            if base_cpu
            else ":"
        )
    )
    for name, (tracer, flush) in isolated_tracers().items():
        us = isolated_us(tracer, flush)
        share = f" = {us / base_cpu * 100:4.1f} %" if base_cpu else ""
        print(f"  tracing {name:<12} {us:6.1f} µs/request{share}")


async def main(args: argparse.Namespace) -> None:
    if args.isolated_only:
        print_isolated(None)
        return
    modes: list[str] = list(dict.fromkeys(args.modes))
    for mode in modes:
        if BASELINE[mode] not in modes:
            raise SystemExit(f"mode {mode!r} is compared with {BASELINE[mode]!r}: include it")
    sink = Sink()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)  # type: ignore[no-untyped-call]
    endpoint = f"http://127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    stacks: dict[str, LocalStack] = {}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    rps: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for mode in modes:
            stacks[mode] = await start_stack(MODES[mode], endpoint, SERVICE_ENV.get(mode, {}))
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=args.concurrency * len(modes))
        ) as http:
            loads = {mode: Load(stack, http) for mode, stack in stacks.items()}
            for load in loads.values():  # warm: connections, caches, the router's view
                await load.burst(args, max(50, args.requests // 5))
            for rnd in range(args.rounds):
                shift = rnd % len(modes)
                for mode in modes[shift:] + modes[:shift]:
                    r, c = await loads[mode].burst(args, args.requests)
                    rps[mode].append(r)
                    cpu[mode].append(c)
                print(
                    f"round {rnd + 1}: "
                    + ", ".join(f"{m} {cpu[m][-1]:.0f}" for m in modes)
                    + " µs/req",
                    file=sys.stderr,
                    flush=True,
                )
            others_us = {mode: load.others_us for mode, load in loads.items()}
    finally:
        for stack in stacks.values():
            await stack.stop()
        await server.stop(0)

    load_desc = f"{args.rate:g} req/s open loop" if args.rate else f"{args.concurrency} in flight"
    print(
        f"\n{args.rounds} rounds × {args.requests} requests per mode, {load_desc}; "
        "edge CPU per request: median (and quartiles) over the rounds"
    )
    print(
        f"{'mode':<22} {'req/s':>6} {'edge CPU µs/req':>22} {'vs':>13} "
        f"{'throughput cost, paired':>26} {'router+worker µs/req':>21}"
    )
    for mode in modes:
        c_q = quartiles(cpu[mode])
        base = BASELINE[mode]
        if base == mode:
            cost = "—"
        else:
            paired = [1 - b / c for b, c in zip(cpu[base], cpu[mode], strict=True)]
            p1, p2, p3 = (100 * x for x in quartiles(paired))
            cost = f"{p2:5.1f} % ({p1:.1f} … {p3:.1f})"
        print(
            f"{mode:<22} {statistics.median(rps[mode]):>6.0f} "
            f"{c_q[1]:>7.0f} ({c_q[0]:.0f} … {c_q[2]:.0f}) {base:>13} {cost:>26} "
            f"{statistics.median(others_us[mode][1:]):>21.0f}"
        )
    print(
        "\n(throughput cost = share of the edge's capacity lost = 1 − CPU per request of the "
        "baseline / of the mode, per round; median and quartiles over the rounds)"
    )
    print(f"spans received by the OTLP sink: {sink.spans}")
    print_isolated(statistics.median(cpu["metrics only"]) if "metrics only" in cpu else None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--requests", type=cli.integer(1, 1_000_000), default=500, help="per mode and round"
    )
    parser.add_argument("--concurrency", type=cli.integer(1, 1024), default=16)
    parser.add_argument("--rounds", type=cli.integer(1, 1000), default=8)
    parser.add_argument(
        "--rate",
        type=cli.finite_float(0, 10_000),
        default=0.0,
        help="send requests at this fixed rate (req/s, open loop) instead of --concurrency "
        "closed loops: every mode does the same work per second (default: closed loops)",
    )
    parser.add_argument(
        "--isolated-only",
        action="store_true",
        help="only time the edge's tracing calls in isolation (no stacks)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=list(MODES),
        default=DEFAULT_MODES,
        metavar="MODE",
        # argparse %-formats help strings, and the modes' names have a % in them
        help=f"modes to run, of {list(MODES)} (default: {DEFAULT_MODES})".replace("%", "%%"),
    )
    asyncio.run(main(parser.parse_args()))
