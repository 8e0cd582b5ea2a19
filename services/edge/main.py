"""``python -m services.edge``: one edge replica.

    python -m services.edge --port 8080 --redis-url redis://127.0.0.1:6379/0 \\
        --router 127.0.0.1:50051 --site seoul

SIGTERM: stop accepting connections, let live streams finish within ``--drain-grace-s``, exit.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

import redis.asyncio as aioredis
from aiohttp import web

from services.common import logs, runtime
from services.common.clock import SYSTEM_CLOCK
from services.common.logs import event
from services.common.net import parse_address
from services.edge.apikeys import ApiKeyStore
from services.edge.app import EdgeDeps, build_app
from services.edge.failover import FailoverPolicy
from services.edge.upstream import RouterClient, WorkerPool

log = logging.getLogger("meridian.edge")


def _port(value: str) -> int:
    if not value.isdigit() or not 0 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {value!r}")
    return int(value)


def _address(value: str) -> str:
    try:
        return parse_address(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _redis_url(value: str) -> str:
    if not value.startswith(("redis://", "rediss://", "unix://")):
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected redis://HOST:PORT/DB, rediss://… or unix://…"
        )
    return value


def _positive(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not f > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return f


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.edge", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8080)
    p.add_argument("--ready-file", type=Path)
    p.add_argument("--redis-url", type=_redis_url, required=True)
    p.add_argument("--router", type=_address, required=True, metavar="HOST:PORT")
    p.add_argument("--site", default="local")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    p.add_argument("--first-token-timeout-s", type=_positive, default=60.0)
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--drain-grace-s", type=_positive, default=10.0)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    redis = aioredis.Redis.from_url(args.redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
    router = RouterClient(args.router)
    workers = WorkerPool()
    deps = EdgeDeps(
        redis=redis,
        keys=ApiKeyStore(redis=redis, clock=SYSTEM_CLOCK),
        router=router,
        workers=workers,
        site=args.site,
        policy=FailoverPolicy(
            max_attempts=args.max_attempts, first_token_timeout_s=args.first_token_timeout_s
        ),
        max_body_bytes=args.max_body_bytes,
    )
    app = build_app(deps)
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=args.drain_grace_s
    )
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    await site.start()
    port = runner.addresses[0][1]
    runtime.write_ready_file(args.ready_file, {"port": port, "host": args.host})
    event(log, "edge.listening", port=port, site=args.site)
    await stop.wait()
    event(log, "edge.draining", grace_s=args.drain_grace_s)
    await runner.cleanup()
    await workers.close()
    await router.close()
    await redis.aclose()
    event(log, "edge.stopped")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_attempts < 1:
        parser.error("--max-attempts must be >= 1")
    if args.max_body_bytes < 1024:
        parser.error("--max-body-bytes must be >= 1024")
    logs.configure("edge", args.log_level)
    runtime.run(lambda stop: serve(args, stop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
