"""``python -m services.edge``: one edge replica.

    python -m services.edge --port 8443 --tls-cert edge.crt --tls-key edge.key \\
        --redis-url redis://127.0.0.1:6379/0 --router 127.0.0.1:50051 --site seoul \\
        --key-pepper-file /run/secrets/key-pepper \\
        --admin-port 9090 --admin-token-file /run/secrets/admin-token

TLS is required unless ``--plain-http`` is given. Secrets come from files or the environment
(``MERIDIAN_KEY_PEPPER``, ``MERIDIAN_ADMIN_TOKEN``), never from the command line, and are
never logged. SIGTERM: stop accepting connections, let live streams finish within
``--drain-grace-s``, end those still running (an SSE error event then ``[DONE]``; a 503 for
a request that has sent nothing), exit — about a second past the grace at most.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from services.common import cli, grpc_tls, logs, runtime, telemetry
from services.common.logs import event
from services.edge.guard import GuardConfig
from services.edge.migration.policy import MigrationPolicy
from services.edge.ratelimit.limiter import FailureMode, RateLimitConfig
from services.edge.redisconn import REDIS_FAILURES, RedisClient, parse_redis_url, shown_url
from services.edge.responses_store import DEFAULT_TTL_S as DEFAULT_RESPONSES_TTL_S
from services.edge.responses_store import MAX_TTL_S as MAX_RESPONSES_TTL_S
from services.edge.server import EdgeConfig, EdgeServer, connect_redis
from services.edge.stages.validate import RequestLimits
from services.edge.supervisor import SupervisorConfig, parse_workers, strip_workers, supervise
from services.edge.tenancy.apikeys import KeyHasher, load_pepper
from services.edge.tenancy.auth import AuthConfig
from services.edge.tls import TlsConfig, server_context
from services.edge.upstream.failover import FailoverPolicy
from services.edge.upstream.resilient_router import ViewConfig
from services.edge.upstream.router_client import RouterClient
from services.edge.upstream.worker_pool import WORKER_TRANSPORTS
from services.edge.web.config import WebConfig, parse_place

log = logging.getLogger("meridian.edge")
ADMIN_TOKEN_ENV = "MERIDIAN_ADMIN_TOKEN"


def _redis_url(value: str) -> str:
    """One server, Sentinel or Cluster (see :mod:`services.edge.redisconn`), validated."""
    try:
        parse_redis_url(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def _integer(low: int) -> Callable[[str], int]:
    """An integer flag's type (float flags use :mod:`services.common.cli`'s, which refuse
    ``nan`` and ``inf``)."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return n

    return parse


def _workers(value: str) -> int:
    try:
        return parse_workers(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


_positive = cli.positive_float
#: An SSE keep-alive interval: > 0, and at most an hour (a larger one is a typo, e.g. ms).
_keepalive = cli.finite_float(0, 3600, low_open=True)
_count = _integer(1)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m services.edge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=cli.port, default=8080)
    p.add_argument("--ready-file", type=cli.output_file)
    p.add_argument("--redis-url", type=_redis_url, required=True)
    p.add_argument("--router", type=cli.address, required=True, metavar="HOST:PORT")
    p.add_argument("--site", default="local")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N|auto",
        help="edge processes on this port (SO_REUSEPORT); auto: one per usable core",
    )
    # Set by the supervisor for each of its children, never by hand.
    p.add_argument("--process-index", type=_integer(0), default=None, help=argparse.SUPPRESS)
    p.add_argument("--process-count", type=_count, default=1, help=argparse.SUPPRESS)
    t = p.add_argument_group("TLS")
    t.add_argument("--tls-cert", type=Path)
    t.add_argument("--tls-key", type=Path)
    t.add_argument("--tls-min-version", choices=["1.2", "1.3"], default="1.2")
    t.add_argument("--plain-http", action="store_true", help="serve HTTP without TLS")
    s = p.add_argument_group("secrets and the admin API")
    s.add_argument("--key-pepper-file", type=Path, help="else $MERIDIAN_KEY_PEPPER")
    s.add_argument("--admin-port", type=cli.port, help="no admin API without it")
    s.add_argument("--admin-host", default="127.0.0.1")
    s.add_argument("--admin-token-file", type=Path, help=f"else ${ADMIN_TOKEN_ENV}")
    r = p.add_argument_group("rate limits and Redis failure")
    r.add_argument("--redis-failure-mode", choices=[m.value for m in FailureMode], default="open")
    r.add_argument("--local-limit-share", type=_positive, default=1.0)
    r.add_argument("--default-completion-tokens", type=_count, default=1024)
    r.add_argument("--auth-cache-ttl-s", type=_positive, default=2.0)
    r.add_argument("--auth-stale-ttl-s", type=_positive, default=300.0)
    g = p.add_argument_group("abuse limits")
    g.add_argument("--max-body-bytes", type=_count, default=4 * 1024 * 1024)
    g.add_argument("--max-messages", type=_count, default=512)
    g.add_argument(
        "--max-choices", type=_count, default=16, help="the largest n a request may ask for"
    )
    g.add_argument("--max-prompt-chars", type=_count, default=1_000_000)
    g.add_argument("--max-connections", type=_count, default=10_000)
    g.add_argument("--max-connections-per-ip", type=_count, default=256)
    g.add_argument("--max-streams", type=_count, default=4096)
    g.add_argument("--max-streams-per-ip", type=_count, default=64)
    g.add_argument("--ip-requests-per-s", type=cli.non_negative_float, default=100.0)
    g.add_argument("--ip-burst", type=_count, default=200)
    g.add_argument("--header-timeout-s", type=_positive, default=10.0)
    g.add_argument("--idle-timeout-s", type=_positive, default=75.0)
    g.add_argument("--body-timeout-s", type=_positive, default=30.0)
    g.add_argument("--write-timeout-s", type=_positive, default=30.0)
    g.add_argument("--max-headers", type=_count, default=64)
    g.add_argument("--max-header-bytes", type=_count, default=8190)
    u = p.add_argument_group("upstreams")
    u.add_argument("--first-token-timeout-s", type=_positive, default=60.0)
    u.add_argument("--max-attempts", type=_count, default=3)
    u.add_argument("--view-refresh-s", type=_positive, default=2.0)
    u.add_argument("--view-max-age-s", type=_positive, default=300.0)
    u.add_argument("--drain-grace-s", type=_positive, default=10.0)
    u.add_argument(
        "--sse-keepalive-after-s",
        type=_keepalive,
        default=3.0,
        help="a stream with no first token yet gets its headers and a first SSE comment "
        "after this long (seconds)",
    )
    u.add_argument(
        "--sse-keepalive-every-s",
        type=_keepalive,
        default=10.0,
        help="then an SSE comment this often until the first token, so proxies with an idle "
        "timeout do not close it (seconds; below their idle timeout)",
    )
    u.add_argument(
        "--responses-ttl-s",
        type=cli.integer(0, MAX_RESPONSES_TTL_S),
        default=DEFAULT_RESPONSES_TTL_S,
        help="how long the Responses API keeps a stored response, so that a later request can "
        "go on from it (previous_response_id) or GET it (seconds, in Redis; 0: store none, "
        "every response says store: false)",
    )
    u.add_argument(
        "--worker-transport",
        choices=WORKER_TRANSPORTS,
        default="mux",
        help="token streams to workers: all of a worker's over one GenerateMux call, one "
        "message per engine step (mux, the default), or one Generate call each (call)",
    )
    m = p.add_argument_group(
        "mid-stream migration (a stream whose worker breaks continues on another worker)"
    )
    m.add_argument(
        "--migration",
        choices=("on", "off"),
        default="on",
        help="off: a break after the first token ends the stream with an error event",
    )
    m.add_argument("--migration-max-attempts", type=_count, default=3, help="migrations per stream")
    m.add_argument(
        "--migration-max-tokens",
        type=_count,
        default=32768,
        help="longest delivered output that is still resumed (tokens)",
    )
    m.add_argument(
        "--migration-max-gap-s",
        type=_positive,
        default=20.0,
        help="longest time a client waits without a token before the stream fails",
    )
    m.add_argument(
        "--migration-stall-s",
        type=_positive,
        default=5.0,
        help="no token for this long after the first one = a broken worker",
    )
    w = p.add_argument_group("web pages (chat at /, fleet map at /console)")
    w.add_argument(
        "--map-place",
        action="append",
        default=[],
        metavar="NAME=LAT,LON",
        help="where the console's map draws this site or a region (repeatable), e.g. kr=37.5,127.0",
    )
    w.add_argument("--console-session-ttl-s", type=cli.finite_float(60), default=8 * 3600.0)
    w.add_argument("--max-console-streams", type=_count, default=16)
    telemetry.add_cli_args(p)
    grpc_tls.add_arguments(p)
    return p


def _web_config(args: argparse.Namespace) -> WebConfig:
    places = []
    for value in args.map_place:
        try:
            places.append(parse_place(value))
        except ValueError as err:
            raise ValueError(f"--map-place: {err}") from None
    try:
        return WebConfig(
            places=tuple(places),
            session_ttl_s=args.console_session_ttl_s,
            max_console_streams=args.max_console_streams,
        )
    except ValueError as err:
        raise ValueError(f"--map-place: {err}") from None


def _admin_token(args: argparse.Namespace) -> str | None:
    if args.admin_port is None:
        return None
    if args.admin_token_file is not None:
        return cli.read_text(args.admin_token_file, flag="--admin-token-file").strip()
    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if not token:
        raise ValueError(f"--admin-port needs --admin-token-file or ${ADMIN_TOKEN_ENV}")
    return token


def _key_hasher(args: argparse.Namespace) -> KeyHasher:
    """The API-key hasher, its pepper from ``--key-pepper-file`` or the environment."""
    if args.key_pepper_file is not None:
        # Unreadable, a directory, not UTF-8: an error naming the flag, before load_pepper.
        cli.read_text(args.key_pepper_file, flag="--key-pepper-file")
    return KeyHasher(load_pepper(file=args.key_pepper_file))


def config_from_args(args: argparse.Namespace) -> EdgeConfig:
    """The validated config; ValueError names what is wrong (never a secret's value)."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    tls = None
    if args.tls_cert is not None:
        tls = TlsConfig(
            cert_file=args.tls_cert, key_file=args.tls_key, min_version=args.tls_min_version
        )
    return EdgeConfig(
        host=args.host,
        port=args.port,
        site=args.site,
        tls=tls,
        plain_http=args.plain_http,
        admin_host=args.admin_host,
        admin_port=args.admin_port,
        admin_token=_admin_token(args),
        guard=GuardConfig(
            max_connections=args.max_connections,
            max_connections_per_ip=args.max_connections_per_ip,
            max_streams=args.max_streams,
            max_streams_per_ip=args.max_streams_per_ip,
            ip_requests_per_s=args.ip_requests_per_s,
            ip_burst=args.ip_burst,
            header_timeout_s=args.header_timeout_s,
            idle_timeout_s=args.idle_timeout_s,
            body_timeout_s=args.body_timeout_s,
            write_timeout_s=args.write_timeout_s,
            max_header_bytes=args.max_header_bytes,
            max_headers=args.max_headers,
        ),
        request_limits=RequestLimits(
            max_body_bytes=args.max_body_bytes,
            max_messages=args.max_messages,
            max_choices=args.max_choices,
            max_prompt_chars=args.max_prompt_chars,
        ),
        auth=AuthConfig(cache_ttl_s=args.auth_cache_ttl_s, stale_ttl_s=args.auth_stale_ttl_s),
        ratelimit=RateLimitConfig(
            failure_mode=FailureMode(args.redis_failure_mode),
            # Each of N processes grants its share of the share while Redis is down.
            local_share=args.local_limit_share / args.process_count,
            default_completion_tokens=args.default_completion_tokens,
        ),
        view=ViewConfig(refresh_every_s=args.view_refresh_s, max_age_s=args.view_max_age_s),
        failover=FailoverPolicy(
            max_attempts=args.max_attempts, first_token_timeout_s=args.first_token_timeout_s
        ),
        migration=_migration_policy(args),
        worker_transport=args.worker_transport,
        grpc_tls=grpc_tls.from_arguments(args),
        drain_grace_s=args.drain_grace_s,
        keepalive_after_s=args.sse_keepalive_after_s,
        responses_ttl_s=args.responses_ttl_s,
        keepalive_every_s=args.sse_keepalive_every_s,
        web=_web_config(args),
        reuse_port=args.process_count > 1,
    )


def _migration_policy(args: argparse.Namespace) -> MigrationPolicy:
    """The migration flags as one policy; a contradiction between two of them is refused at
    start-up (exit code 2), naming both flags."""
    for flag, value in (
        ("--migration-stall-s", args.migration_stall_s),
        ("--migration-max-gap-s", args.migration_max_gap_s),
    ):
        if not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite number of seconds, got {value}")
    if args.migration_stall_s >= args.migration_max_gap_s:
        raise ValueError(
            f"--migration-stall-s ({args.migration_stall_s:g}) must be below "
            f"--migration-max-gap-s ({args.migration_max_gap_s:g})"
        )
    return MigrationPolicy(
        enabled=args.migration == "on",
        max_migrations=int(args.migration_max_attempts),
        max_resumable_tokens=int(args.migration_max_tokens),
        max_gap_s=args.migration_max_gap_s,
        stall_s=args.migration_stall_s,
    )


async def warn_if_redis_unreachable(redis: RedisClient, url: str) -> None:
    """One warning at start when Redis does not answer (the edge serves anyway, by its
    failure mode): otherwise the first clue was an ``auth.unavailable`` on a request, with
    no address in it."""
    try:
        async with asyncio.timeout(REDIS_CHECK_TIMEOUT_S):
            await redis.ping()
    except REDIS_FAILURES as err:  # a timeout (asyncio.timeout) is an OSError too
        event(
            log,
            "edge.redis_unreachable",
            level=logging.WARNING,
            url=shown_url(url),
            error=f"{type(err).__name__}: {err}"[:300],
        )


REDIS_CHECK_TIMEOUT_S = 3.0


async def serve(
    config: EdgeConfig, hasher: KeyHasher, args: argparse.Namespace, stop: asyncio.Event
) -> None:
    attributes = {"meridian.site": config.site}
    if args.process_index is not None:
        attributes["meridian.process"] = str(args.process_index)
    tel = telemetry.setup("edge", resource_attributes=attributes)
    redis = connect_redis(args.redis_url)
    edge = EdgeServer(
        config=config,
        redis=redis,
        router=RouterClient(args.router, tls=config.grpc_tls),
        hasher=hasher,
        telemetry=tel,
    )
    await edge.start()
    metrics_port = None
    metrics_runner = None
    if args.metrics_port is not None:
        metrics_runner, metrics_port = await telemetry.serve_metrics(
            tel, args.metrics_host, args.metrics_port
        )
    runtime.settle_gc()
    runtime.write_ready_file(
        args.ready_file,
        {
            "port": edge.port,
            "host": config.host,
            "scheme": edge.scheme,
            "admin_port": edge.admin_port,
            "metrics_port": metrics_port,
        },
    )
    event(
        log,
        "edge.listening",
        port=edge.port,
        scheme=edge.scheme,
        site=config.site,
        mutual_tls=config.grpc_tls is not None,
    )
    check = asyncio.create_task(warn_if_redis_unreachable(redis, args.redis_url))
    await stop.wait()
    check.cancel()
    event(log, "edge.draining", grace_s=config.drain_grace_s)
    await edge.stop()
    if metrics_runner is not None:
        await metrics_runner.cleanup()
    tel.shutdown()
    event(log, "edge.stopped", counters=edge.counters.snapshot())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        hasher = _key_hasher(args)
        if config.tls is not None:
            server_context(config.tls)  # unreadable certificates stop us here, not later
        telemetry.check_env(os.environ)  # a bad sampler or tracer stops us here

    except ValueError as err:
        parser.error(str(err))
    logs.configure("edge", args.log_level)
    if args.workers > 1 and args.process_index is None:
        return supervise(
            SupervisorConfig(
                argv=strip_workers(sys.argv[1:] if argv is None else argv),
                workers=args.workers,
                host=config.host,
                port=config.port,
                admin_port=args.admin_port,
                metrics_port=args.metrics_port,
                ready_file=args.ready_file,
                drain_grace_s=config.drain_grace_s,
            )
        )
    runtime.run(lambda stop: serve(config, hasher, args, stop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
