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
import os
import sys
from pathlib import Path

from services.common import cli, grpc_tls, logs, runtime, telemetry
from services.common.grpc_tls import GrpcTls
from services.router.debug import DebugConfig
from services.router.discovery import DiscoveryConfig
from services.router.discovery.dns import DnsTarget
from services.router.fleet import FleetConfig
from services.router.scheduling.profile import ProfileError, load_profile
from services.router.server import RouterConfig, RouterServer
from services.router.service import Scheduler
from services.router.watcher import WatchConfig

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
    p.add_argument("--ready-file", type=cli.output_file)
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
    grpc_tls.add_arguments(p)
    return p


def router_config(
    args: argparse.Namespace, debug: DebugConfig | None, tls: GrpcTls | None = None
) -> RouterConfig:
    return RouterConfig(
        site=args.site,
        host=args.host,
        port=args.port,
        fleet=FleetConfig(stale_after_s=args.stale_after_ms / 1000),
        discovery=DiscoveryConfig(
            static=tuple(args.worker),
            dns=tuple(args.worker_dns),
            dns_interval_s=args.dns_interval_ms / 1000,
            announce_dir=args.announce_dir,
            announce_interval_s=args.announce_interval_ms / 1000,
            watch=WatchConfig(
                report_interval_ms=args.report_interval_ms,
                probe_interval_s=args.probe_interval_ms / 1000,
                tls=tls,
            ),
        ),
        debug=debug,
        tls=tls,
    )


def debug_config(args: argparse.Namespace, environ: dict[str, str]) -> DebugConfig | None:
    """The debug endpoint's settings, or None when it is off. Raises ValueError."""
    if args.debug_port is None:
        return None
    token: str | None = environ.get(TOKEN_ENV) or None
    if args.debug_token_file is not None:
        token = cli.read_text(args.debug_token_file, flag="--debug-token-file").strip()
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
    config: RouterConfig, scheduler: Scheduler, args: argparse.Namespace, stop: asyncio.Event
) -> None:
    tel = telemetry.setup("router", resource_attributes={"meridian.site": config.site})
    router = RouterServer(config=config, scheduler=scheduler, telemetry=tel)
    ready: dict[str, object] = {"host": config.host}
    metrics_runner = None
    if args.metrics_port is not None:  # bound before gRPC: a taken port stops us cleanly
        metrics_runner, ready["metrics_port"] = await telemetry.serve_metrics(
            tel, args.metrics_host, args.metrics_port
        )
    try:
        ready["port"] = await router.start()
    except BaseException:
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        raise
    if router.debug_port is not None:
        ready["debug_port"] = router.debug_port
    runtime.settle_gc()
    runtime.write_ready_file(args.ready_file, ready)
    await stop.wait()
    await router.stop()
    if metrics_runner is not None:
        await metrics_runner.cleanup()
    tel.shutdown()


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = check_sources(args)
    if problem is not None:
        parser.error(problem)
    env = dict(os.environ) if environ is None else environ
    try:
        debug = debug_config(args, env)
        tls = grpc_tls.from_arguments(args)
        telemetry.check_env(env)  # a bad sampler or tracer stops us here
    except ValueError as err:
        parser.error(str(err))
    try:
        scheduler = load_profile(args.profile)  # fail fast, before listening
    except ProfileError as err:
        parser.error(f"--profile {args.profile}: {err}")
    logs.configure("router", args.log_level)
    config = router_config(args, debug, tls)
    runtime.run(lambda stop: serve(config, scheduler, args, stop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
