"""``python -m services.router``: one router replica (one per edge site).

    python -m services.router --site seoul --port 50051 \\
        --worker 127.0.0.1:50061 --worker 127.0.0.1:50062 \\
        --worker-dns workers.kr.svc.cluster.local:7000 \\
        --announce-dir /run/meridian/workers \\
        --profile deploy/router/profiles/default.yaml \\
        --debug-port 9151

Workers come from any mix of static addresses, DNS names re-resolved periodically and an
announcement directory (see ``discovery.py``). Each replica builds its own view (its own
probes, its own load streams): nothing is shared between replicas but the workers they watch
(docs/router.md). The debug endpoint is off unless ``--debug-port`` is given; off loopback it
needs a token, read from ``--debug-token-file`` or ``MERIDIAN_ROUTER_DEBUG_TOKEN`` (never from
the command line, where every local user could read it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from meridian.v1 import router_pb2_grpc
from services.common import cli, logs, runtime, telemetry
from services.common.clock import SYSTEM_CLOCK
from services.common.grpcutil import Health, new_server
from services.common.logs import event
from services.common.startup import StartupError, bind_grpc
from services.router.debug import DebugConfig, DebugEndpoint
from services.router.discovery import Discovery, DiscoveryConfig
from services.router.dns import DnsTarget
from services.router.observability import RouterTelemetry
from services.router.registry import RegistryConfig, WorkerRegistry
from services.router.scheduling.profile import ProfileError, load_profile
from services.router.service import RouterService, Scheduler
from services.router.watcher import WatchConfig

log = logging.getLogger("meridian.router")

DEFAULT_PROFILE = Path(__file__).resolve().parents[2] / "deploy/router/profiles/default.yaml"
TOKEN_ENV = "MERIDIAN_ROUTER_DEBUG_TOKEN"


def _dns_target(value: str) -> DnsTarget:
    try:
        return DnsTarget.parse(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _ms(value: str) -> int:
    if not value.isdigit() or not 10 <= int(value) <= 60_000:
        raise argparse.ArgumentTypeError(f"must be 10..60000 milliseconds, got {value!r}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m services.router",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--site", default="local", help="this replica's edge site name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=cli.port, default=0)
    p.add_argument("--ready-file", type=Path)
    p.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, help="scheduling profile YAML")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    d = p.add_argument_group("discovery (at least one source)")
    d.add_argument(
        "--worker",
        type=cli.address,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a worker to watch (repeatable)",
    )
    d.add_argument(
        "--worker-dns",
        type=_dns_target,
        action="append",
        default=[],
        metavar="NAME:PORT",
        help="a DNS name whose every address is a worker (repeatable; re-resolved)",
    )
    d.add_argument("--dns-interval-ms", type=_ms, default=5000, help="re-resolution period")
    d.add_argument(
        "--announce-dir",
        type=Path,
        help="a directory where workers announce themselves (one JSON file each)",
    )
    d.add_argument("--announce-interval-ms", type=_ms, default=1000, help="directory scan period")

    w = p.add_argument_group("worker view")
    w.add_argument("--report-interval-ms", type=_ms, default=100)
    w.add_argument("--probe-interval-ms", type=_ms, default=250)
    w.add_argument("--stale-after-ms", type=_ms, default=600)

    g = p.add_argument_group("debug endpoint")
    g.add_argument("--debug-host", default="127.0.0.1")
    g.add_argument("--debug-port", type=cli.port, help="serve /debug/* on this port (0: any free)")
    g.add_argument(
        "--debug-token-file", type=Path, help=f"bearer token for /debug/* (or ${TOKEN_ENV})"
    )
    telemetry.add_cli_args(p)
    return p


def discovery_config(args: argparse.Namespace) -> DiscoveryConfig:
    return DiscoveryConfig(
        static=tuple(args.worker),
        dns=tuple(args.worker_dns),
        dns_interval_s=args.dns_interval_ms / 1000,
        announce_dir=args.announce_dir,
        announce_interval_s=args.announce_interval_ms / 1000,
        watch=WatchConfig(
            report_interval_ms=args.report_interval_ms,
            probe_interval_s=args.probe_interval_ms / 1000,
        ),
    )


def debug_config(args: argparse.Namespace, environ: dict[str, str]) -> DebugConfig | None:
    """The debug endpoint's settings, or None when it is off. Raises ValueError."""
    if args.debug_port is None:
        return None
    token: str | None = environ.get(TOKEN_ENV) or None
    if args.debug_token_file is not None:
        try:
            token = args.debug_token_file.read_text(encoding="utf-8").strip()
        except OSError as err:
            raise ValueError(f"--debug-token-file: {err.strerror or err}") from None
    return DebugConfig(host=args.debug_host, port=args.debug_port, token=token)


def check_sources(args: argparse.Namespace) -> str | None:
    """Why the discovery flags cannot work, or None."""
    if not (args.worker or args.worker_dns or args.announce_dir):
        return "no workers to watch: give --worker, --worker-dns or --announce-dir"
    announce = args.announce_dir
    if announce is not None and announce.exists() and not announce.is_dir():
        return f"--announce-dir {args.announce_dir}: not a directory"
    return None


async def serve(
    args: argparse.Namespace,
    scheduler: Scheduler,
    debug: DebugConfig | None,
    stop: asyncio.Event,
) -> None:
    registry = WorkerRegistry(RegistryConfig(stale_after_s=args.stale_after_ms / 1000))
    discovery = Discovery(registry=registry, clock=SYSTEM_CLOCK, config=discovery_config(args))
    tel = telemetry.setup("router", resource_attributes={"meridian.site": args.site})
    service = RouterService(
        registry=registry,
        scheduler=scheduler,
        clock=SYSTEM_CLOCK,
        site=args.site,
        telemetry=RouterTelemetry(
            tracer=tel.tracer,
            meter=tel.meter,
            snapshots=lambda: registry.snapshots(SYSTEM_CLOCK.monotonic()),
        ),
    )
    health = Health(["meridian.v1.Router"])
    server = new_server()
    router_pb2_grpc.add_RouterServicer_to_server(service, server)
    health.add_to(server)
    port = bind_grpc(server, args.host, args.port, "the router's gRPC API")
    endpoint = None
    ready: dict[str, object] = {"port": port, "host": args.host}
    # Every listener is bound before gRPC starts: a taken port stops the router cleanly.
    if debug is not None:
        endpoint = DebugEndpoint(config=debug, service=service, membership=discovery.membership)
        ready["debug_port"] = await endpoint.start()
    metrics_runner = None
    if args.metrics_port is not None:
        try:
            metrics_runner, ready["metrics_port"] = await telemetry.serve_metrics(
                tel, args.metrics_host, args.metrics_port
            )
        except StartupError:
            if endpoint is not None:
                await endpoint.stop()
            raise
    await server.start()
    discovery.start()
    await health.set_serving(True)
    runtime.settle_gc()
    runtime.write_ready_file(args.ready_file, ready)
    event(
        log,
        "router.listening",
        port=port,
        site=args.site,
        profile=scheduler.name,
        workers=len(args.worker),
        dns=[str(t) for t in args.worker_dns],
        announce_dir=str(args.announce_dir) if args.announce_dir else None,
        debug_port=ready.get("debug_port"),
    )
    await stop.wait()
    await health.shutdown()
    if endpoint is not None:
        await endpoint.stop()
    await server.stop(grace=1.0)
    await discovery.stop()
    if metrics_runner is not None:
        await metrics_runner.cleanup()
    tel.shutdown()
    event(log, "router.stopped")


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = check_sources(args)
    if problem is not None:
        parser.error(problem)
    env = dict(os.environ) if environ is None else environ
    try:
        debug = debug_config(args, env)
        telemetry.sampler_from_env(env)  # a bad OTEL_TRACES_SAMPLER stops us here
    except ValueError as err:
        parser.error(str(err))
    try:
        scheduler = load_profile(args.profile)  # fail fast, before listening
    except ProfileError as err:
        parser.error(f"--profile {args.profile}: {err}")
    logs.configure("router", args.log_level)
    runtime.run(lambda stop: serve(args, scheduler, debug, stop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
