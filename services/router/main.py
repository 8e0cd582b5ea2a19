"""``python -m services.router``: one router replica (one per edge site).

    python -m services.router --site seoul --port 50051 \\
        --worker 127.0.0.1:50061 --worker 127.0.0.1:50062 \\
        --profile deploy/router/profiles/default.yaml

Each replica builds its own view (its own probes, its own load streams): nothing is shared
between replicas but the workers they watch.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from meridian.v1 import router_pb2_grpc
from services.common import logs, runtime
from services.common.clock import SYSTEM_CLOCK
from services.common.grpcutil import Health, new_server
from services.common.logs import event
from services.common.net import parse_address
from services.router.discovery import StaticDiscovery
from services.router.registry import RegistryConfig, WorkerRegistry
from services.router.scheduling.profile import ProfileError, load_profile
from services.router.service import RouterService, Scheduler

log = logging.getLogger("meridian.router")

DEFAULT_PROFILE = Path(__file__).resolve().parents[2] / "deploy/router/profiles/default.yaml"


def _address(value: str) -> str:
    try:
        return parse_address(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _port(value: str) -> int:
    if not value.isdigit() or not 0 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {value!r}")
    return int(value)


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
    p.add_argument("--port", type=_port, default=0)
    p.add_argument("--ready-file", type=Path)
    p.add_argument(
        "--worker",
        type=_address,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a worker to watch (repeatable)",
    )
    p.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, help="scheduling profile YAML")
    p.add_argument("--report-interval-ms", type=_ms, default=100)
    p.add_argument("--stale-after-ms", type=_ms, default=600)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


async def serve(args: argparse.Namespace, scheduler: Scheduler, stop: asyncio.Event) -> None:
    registry = WorkerRegistry(RegistryConfig(stale_after_s=args.stale_after_ms / 1000))
    discovery = StaticDiscovery(
        registry=registry,
        clock=SYSTEM_CLOCK,
        addresses=args.worker,
        report_interval_ms=args.report_interval_ms,
    )
    service = RouterService(
        registry=registry, scheduler=scheduler, clock=SYSTEM_CLOCK, site=args.site
    )
    health = Health(["meridian.v1.Router"])
    server = new_server()
    router_pb2_grpc.add_RouterServicer_to_server(service, server)
    health.add_to(server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    await server.start()
    discovery.start()
    await health.set_serving(True)
    runtime.write_ready_file(args.ready_file, {"port": port, "host": args.host})
    event(log, "router.listening", port=port, site=args.site, workers=len(args.worker))
    await stop.wait()
    await health.shutdown()
    await server.stop(grace=1.0)
    await discovery.stop()
    event(log, "router.stopped")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure("router", args.log_level)
    try:
        scheduler = load_profile(args.profile)  # fail fast, before listening
    except ProfileError as err:
        parser.error(f"--profile {args.profile}: {err}")
    runtime.run(lambda stop: serve(args, scheduler, stop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
