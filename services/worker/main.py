"""``python -m services.worker``: one regional worker process.

    python -m services.worker --engine sim --region kr --worker-id kr-1 --port 50061
    python -m services.worker --engine vllm --model /models/llama --region us --port 50061
    python -m services.worker --engine openai --upstream-url http://10.0.0.7:8000/v1 \
        --region us --worker-id us-1 --port 50061

The gRPC server listens before the engine has loaded: health says NOT_SERVING and load reports
say LOADING, so routers learn about the worker at once but send it nothing until it is ready.
SIGTERM drains (no new requests, in-flight ones finish within ``--drain-grace-s``), then exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from pathlib import Path

from services.common import cli, grpc_tls, logs, runtime, telemetry
from services.common.grpc_tls import GrpcTls
from services.worker.engine import Engine, EngineConfigError
from services.worker.engine_factory import ENGINE_NAMES, build_engine
from services.worker.server import WorkerConfig, WorkerServer
from services.worker.service import EARLY_REPORT_LOAD, MAX_LOAD_WATCHERS
from services.worker.upstream import options as upstream_options

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _identifier(value: str) -> str:
    if not _ID_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} must be 1-64 characters of letters, digits, '.', '_' or '-'"
        )
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m services.worker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--engine", choices=ENGINE_NAMES, default="sim")
    p.add_argument("--worker-id", type=_identifier, required=True)
    p.add_argument("--region", type=_identifier, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--port", type=cli.port, default=0, help="0 picks a free port (see --ready-file)"
    )
    p.add_argument(
        "--ready-file", type=cli.output_file, help="write {'port': N} here once listening"
    )
    p.add_argument("--report-interval-ms", type=cli.positive_float, default=100.0)
    p.add_argument(
        "--early-report-load",
        type=cli.fraction,
        default=EARLY_REPORT_LOAD,
        help="from this load (0..1) a request ending pushes a load report at once, so routers "
        "that refuse work near saturation see the room (default: %(default)s)",
    )
    p.add_argument("--drain-grace-s", type=cli.positive_float, default=10.0)
    p.add_argument(
        "--max-load-watchers",
        type=cli.positive_int,
        default=MAX_LOAD_WATCHERS,
        help="WatchLoad streams open at once at most, one per router replica normally; one "
        "more is refused with RESOURCE_EXHAUSTED (default: %(default)s)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g = p.add_argument_group("model")
    g.add_argument("--model", help="vllm: path or name of the weights; sim: served model name")
    g.add_argument("--served-model-name", help="the name clients ask for (default: --model)")
    g.add_argument("--max-model-len", type=cli.integer(1), help="context length in tokens")
    g.add_argument(
        "--max-num-seqs", type=cli.integer(1), help="max concurrent sequences in a batch"
    )
    v = p.add_argument_group("vllm engine")
    v.add_argument("--dtype", default="auto")
    v.add_argument(
        "--gpu-memory-utilization",
        type=cli.finite_float(0, 1, low_open=True),
        help="the share of the GPU's memory vLLM may use, in (0, 1]",
    )
    v.add_argument("--tensor-parallel-size", type=cli.integer(1, 1024), default=1)
    v.add_argument("--enforce-eager", action="store_true")
    v.add_argument("--no-prefix-caching", action="store_true")
    v.add_argument("--scheduling-policy", choices=["fcfs", "priority"])
    v.add_argument(
        "--tool-call-parser", help="vLLM tool parser for the model's call format (e.g. hermes)"
    )
    v.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="let the model decide to call tools (tool_choice auto); needs --tool-call-parser",
    )
    v.add_argument(
        "--structured-outputs-backend",
        help="vLLM grammar backend: auto, xgrammar, guidance, outlines, lm-format-enforcer",
    )
    v.add_argument(
        "--tool-strict-level",
        choices=["auto", "function", "parameter"],
        help="vLLM's tool-call constraint floor (default auto)",
    )
    v.add_argument(
        "--tool-call-constraint",
        choices=["auto", "json"],
        help="required/named tool choices: the parser's structural tag (auto) or guided JSON",
    )
    v.add_argument(
        "--structured-outputs-compact",
        action="store_true",
        help="structured JSON without optional whitespace (vLLM's disable_any_whitespace)",
    )
    v.add_argument(
        "--engine-metrics",
        action="store_true",
        help="also record vLLM's own Prometheus metrics (vllm:*) and serve them on /metrics "
        "(off: they cost a sixth of the worker's CPU per token)",
    )
    v.add_argument("--quantization", help="vLLM quantization method (fp8, awq, gptq, ...)")
    v.add_argument(
        "--speculative-config",
        help='speculative decoding, vLLM\'s JSON (e.g. {"method": "ngram", '
        '"num_speculative_tokens": 3, "prompt_lookup_max": 4})',
    )
    v.add_argument("--max-choices", type=int, help="the largest n a request may ask for (16)")
    v.add_argument(
        "--runner",
        choices=["generate", "pooling"],
        help="generate (chat, completions; default) or pooling (embeddings, vLLM's pooling runner)",
    )
    s = p.add_argument_group("sim engine")
    s.add_argument("--sim-config", type=Path, help="YAML file of SimConfig fields")
    s.add_argument(
        "--sim",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one SimConfig field (repeatable)",
    )
    upstream_options.add_arguments(p)
    telemetry.add_cli_args(p)
    grpc_tls.add_arguments(p)
    return p


def worker_config(args: argparse.Namespace, tls: GrpcTls | None = None) -> WorkerConfig:
    return WorkerConfig(
        worker_id=args.worker_id,
        region=args.region,
        host=args.host,
        port=args.port,
        report_interval_s=args.report_interval_ms / 1000,
        early_report_load=args.early_report_load,
        drain_grace_s=args.drain_grace_s,
        max_load_watchers=args.max_load_watchers,
        tls=tls,
    )


async def serve(
    args: argparse.Namespace, engine: Engine, stop: asyncio.Event, tls: GrpcTls | None = None
) -> None:
    tel = telemetry.setup(
        "worker",
        resource_attributes={"meridian.region": args.region, "meridian.worker": args.worker_id},
    )
    worker = WorkerServer(config=worker_config(args, tls), engine=engine, telemetry=tel)
    ready: dict[str, object] = {"host": args.host}
    metrics_runner = None
    if args.metrics_port is not None:  # bound before gRPC: a taken port stops us cleanly
        metrics_runner, ready["metrics_port"] = await telemetry.serve_metrics(
            tel, args.metrics_host, args.metrics_port
        )
    try:
        ready["port"] = await worker.start()
    except BaseException:
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        raise
    runtime.settle_gc()
    runtime.write_ready_file(args.ready_file, ready)
    await worker.wait_loaded_or(stop)
    await stop.wait()
    await worker.stop()
    if metrics_runner is not None:
        await metrics_runner.cleanup()
    tel.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        telemetry.check_env(os.environ)  # a bad sampler or tracer stops us here
        tls = grpc_tls.from_arguments(args)
        engine = build_engine(args)
    except (EngineConfigError, ValueError) as err:
        parser.error(str(err))
    logs.configure("worker", args.log_level)  # after the flags: a refused flag logs nothing
    runtime.run(lambda stop: serve(args, engine, stop, tls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
