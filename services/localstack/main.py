"""``make run`` / ``python -m services.localstack``: the whole local multi-region stack.

Starts Redis (unless ``REDIS_URL`` is set), simulated workers in three regions behind a delay
proxy (``--engine vllm``: the real vLLM workers of the config's ``vllm:`` section, serving a
tiny model built into the state folder), one router and the edge on 127.0.0.1:8080
(``EDGE_PORT`` overrides; ``EDGE_WORKERS`` edge processes on it, default 1), prints the URL
and a demo API key (also written to ``.meridian/demo-key``), and stops everything cleanly on
Ctrl-C or SIGTERM. Process logs go to ``.meridian/run/logs/``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path

from services.common import cli, runtime
from services.common.net import redact_url
from services.edge.supervisor import parse_workers
from services.localstack.config import StackConfigError, load_stack_config
from services.localstack.procs import ProcessFailed
from services.localstack.stack import REPO_ROOT, LocalStack

DEFAULT_CONFIG = REPO_ROOT / "deploy/local/stack.yaml"
STATE_DIR = Path(os.environ.get("MERIDIAN_STATE_DIR", ".meridian"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m services.localstack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--engine", choices=["sim", "vllm"], default="sim")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument(
        "--state-dir",
        type=cli.output_dir,
        default=str(STATE_DIR),  # a string, so a bad $MERIDIAN_STATE_DIR is refused the same way
        help="where the stack keeps its state, logs and the demo key (default: %(default)s)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--tls",
        action="store_true",
        default=os.environ.get("MERIDIAN_TLS", "") in {"1", "true", "yes"},
        help="serve the edge over HTTPS with a generated self-signed certificate",
    )
    p.add_argument(
        "--grpc-tls",
        action="store_true",
        default=os.environ.get("MERIDIAN_GRPC_TLS", "") in {"1", "true", "yes"},
        help="mutual TLS between edge, router and workers, with a generated development CA",
    )
    return p


def _edge_port() -> int:
    raw = os.environ.get("EDGE_PORT", "8080")
    if not raw.isdigit() or not 0 <= int(raw) <= 65535:
        raise SystemExit(f"EDGE_PORT must be a port number 0..65535, got {raw!r}")
    return int(raw)


def _edge_workers() -> int:
    """``EDGE_WORKERS``: edge processes on the one port (``--workers``): a count or ``auto``
    (one per usable core). 1 by default: on a 2-core machine the router, the workers, Redis
    and the delay proxies share the cores with the edge."""
    raw = os.environ.get("EDGE_WORKERS", "1")
    try:
        return parse_workers(raw)
    except ValueError as err:
        raise SystemExit(f"EDGE_WORKERS {err}") from None


def _banner(stack: LocalStack, key_file: Path) -> str:
    ep = stack.endpoints
    tls = f"\n  TLS certificate to trust:  {ep.tls_cert}" if ep.tls_cert else ""
    if ep.grpc_tls_ca:
        tls += f"\n  Internal gRPC:             mutual TLS, CA {ep.grpc_tls_ca}"
    cacert = f"--cacert {ep.tls_cert} " if ep.tls_cert else ""
    metrics = "  ".join(f"{name}={url}" for name, url in ep.metrics.items())
    rows = "\n".join(
        f"    {w.name:<12} region={w.region:<4} rtt={_rtt(stack, w.region):>5} ms  {w.proxied}"
        for w in ep.workers.values()
    )
    return f"""
Meridian local stack is up.

  Edge (OpenAI-compatible):  {ep.edge_url}/v1
  Demo API key:              {ep.demo_key}   (also in {key_file})
  Model:                     {ep.model}{tls}
  Admin API:                 {ep.admin_url}   (token in {stack.run_dir / "secrets" / "admin-token"})
  Router:                    {ep.router}   (debug view: {ep.router_debug_url}/debug/view)
  Redis:                     {redact_url(ep.redis_url)}
  Workers (through the delay proxy):
{rows}

Try it:
  curl {cacert}{ep.edge_url}/v1/chat/completions -H "Authorization: Bearer $(cat {key_file})" \\
       -H "Content-Type: application/json" \\
       -d '{{"model": "{ep.model}", "messages": [{{"role": "user", "content": "Hello"}}]}}'

Metrics (Prometheus): {metrics}
Logs: {stack.run_dir / "logs"}   Ctrl-C stops everything.
"""


def _describe(stack: LocalStack) -> dict[str, object]:
    """Machine-readable endpoints and process ids (run/stack.json), for scripts and tests."""
    ep = stack.endpoints
    return {
        "edge_url": ep.edge_url,
        "admin_url": ep.admin_url,
        "tls_cert": ep.tls_cert,
        "grpc_tls_ca": ep.grpc_tls_ca,
        "router_debug_url": ep.router_debug_url,
        "metrics": ep.metrics,
        "router": ep.router,
        "redis_url": ep.redis_url,
        "model": ep.model,
        "workers": {
            name: {"region": w.region, "direct": w.direct, "proxied": w.proxied}
            for name, w in ep.workers.items()
        },
        "pids": {
            **{p.name: p.pid for p in stack.processes()},
            # an edge of several processes (EDGE_WORKERS): edge is its supervisor
            **{
                f"edge.{i}": child["pid"]
                for i, child in enumerate(
                    stack.edge.ready_info.get("processes", []) if stack.edge else []
                )
            },
        },
    }


def _rtt(stack: LocalStack, region: str) -> str:
    for r in stack.config.regions:
        if r.name == region:
            return f"{r.rtt_ms:g}"
    return "?"


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    config = load_stack_config(args.config)
    state = args.state_dir
    state.mkdir(parents=True, exist_ok=True)
    model_path = embed_path = None
    if args.engine == "vllm":
        from services.worker.vllm.tinymodel import TinyModelSpec, build_tiny_model

        model_path = build_tiny_model(state / "tiny-model")
        if any(config.vllm_embedding_regions.values()):
            embed_path = build_tiny_model(state / "tiny-embed", TinyModelSpec(matryoshka=True))
    stack = LocalStack(
        config=config,
        run_dir=state / "run",
        engine=args.engine,
        edge_port=_edge_port(),
        edge_workers=_edge_workers(),
        redis_url=os.environ.get("REDIS_URL") or None,
        vllm_model_path=model_path,
        vllm_embedding_model_path=embed_path,
        log_level=args.log_level,
        tls=args.tls,
        grpc_tls=args.grpc_tls,
    )
    # A script that waits for /healthz and then reads the key must never read the last run's:
    # the old key goes before anything listens, the new one appears whole, once all is up.
    key_file = state / "demo-key"
    key_file.unlink(missing_ok=True)
    (state / "run" / "stack.json").unlink(missing_ok=True)  # likewise the last run's endpoints
    starting = asyncio.create_task(stack.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        print("stopping before the stack was up…", file=sys.stderr)
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        return
    stopping.cancel()
    try:
        starting.result()
    except ProcessFailed as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    write_private(key_file, stack.endpoints.demo_key + "\n")
    runtime.write_ready_file(stack.run_dir / "stack.json", _describe(stack))
    print(_banner(stack, key_file), flush=True)
    reported: set[str] = set()
    while not stop.is_set():
        for proc in stack.processes():
            if not proc.alive() and proc.name not in reported:
                reported.add(proc.name)
                print(
                    f"warning: {proc.name} exited (code {proc.proc and proc.proc.returncode}); "
                    f"see {proc.log_path}",
                    file=sys.stderr,
                    flush=True,
                )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)
    print("\nstopping the stack…", flush=True)
    await stack.stop()
    print("stopped.", flush=True)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file + rename), readable by the owner only
    from its first byte."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = load_stack_config(args.config)
    except StackConfigError as err:
        parser.error(f"--config: {err}")
    if args.engine == "vllm" and not any(config.vllm_regions.values()):
        parser.error(f"--config: {args.config}: vllm.regions: no vLLM worker to start")
    runtime.run(lambda stop: serve(args, stop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
