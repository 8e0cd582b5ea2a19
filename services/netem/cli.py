"""The multi-route netem process: one :class:`~services.netem.proxy.DelayProxy` per ``--route``.

    python -m services.netem \\
        --route kr:127.0.0.1:0=127.0.0.1:50051,delay_ms=40,jitter_ms=2,loss=0.01 \\
        --route eu:127.0.0.1:0=127.0.0.1:50052,delay_ms=120 \\
        --ready-file .meridian/netem.json

Route syntax: see :mod:`services.netem.config`. Once every route listens, the ready file holds
``{"pid": ..., "routes": {NAME: {"host": ..., "port": ...}}}`` (ports are the bound ones, so
port 0 is fine). SIGTERM/SIGINT close every proxy and exit 0. Bad input exits 2 with a message
naming the route and key; an address that cannot be bound exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.common import cli, logs, runtime
from services.common.errors import InvalidRequest
from services.common.logs import event
from services.netem.config import Route, parse_route
from services.netem.proxy import DelayProxy

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    routes: tuple[Route, ...]
    ready_file: Path | None
    log_level: str


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m services.netem",
        description="TCP delay proxies that emulate network distance between local services.",
    )
    parser.add_argument(
        "--route",
        action="append",
        required=True,
        metavar="NAME:LISTEN_HOST:LISTEN_PORT=UPSTREAM_HOST:UPSTREAM_PORT,delay_ms=MS[,...]",
        help="a proxied route; optional keys: jitter_ms, loss (0..1), rto_ms, seed. Repeatable.",
    )
    parser.add_argument(
        "--ready-file", type=cli.output_file, default=None, help="JSON written once listening"
    )
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Parse and validate; any bad value ends in ``parser.error`` (exit 2, message on stderr)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    routes: list[Route] = []
    for text in args.route:
        try:
            route = parse_route(text)
        except InvalidRequest as err:
            parser.error(f"--route {text!r}: {err.message}")
        for other in routes:
            if other.name == route.name:
                parser.error(f"--route {text!r}: route[{route.name}]: name used twice")
            same_listen = (other.listen_host, other.listen_port) == (
                route.listen_host,
                route.listen_port,
            )
            if same_listen and route.listen_port != 0:
                parser.error(
                    f"--route {text!r}: route[{route.name}].listen: "
                    f"{route.listen_host}:{route.listen_port} already used by route[{other.name}]"
                )
        routes.append(route)
    return Options(routes=tuple(routes), ready_file=args.ready_file, log_level=args.log_level)


async def serve(options: Options, stop: asyncio.Event) -> int:
    """Start every route, write the ready file, wait for ``stop``, close. Returns an exit code."""
    proxies: list[DelayProxy] = []
    try:
        for route in options.routes:
            proxy = DelayProxy(route)
            try:
                await proxy.start()
            except OSError as err:
                event(
                    log,
                    "netem.bind_failed",
                    level=logging.ERROR,
                    route=route.name,
                    host=route.listen_host,
                    port=route.listen_port,
                    error=str(err),
                )
                return 1
            proxies.append(proxy)
        runtime.write_ready_file(
            options.ready_file,
            {"routes": {p.route.name: {"host": p.host, "port": p.port} for p in proxies}},
        )
        event(log, "netem.ready", routes=len(proxies))
        await stop.wait()
        event(log, "netem.stopping")
        return 0
    finally:
        await asyncio.gather(*(p.close() for p in proxies))


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_args(argv)
    logs.configure("netem", options.log_level)
    exit_code = 0

    async def run_serve(stop: asyncio.Event) -> None:
        nonlocal exit_code
        exit_code = await serve(options, stop)

    runtime.run(run_serve)
    raise SystemExit(exit_code)
