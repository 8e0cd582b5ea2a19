"""``python -m services.localstack.compose``: the compose stack on a Docker engine, for people.

    python -m services.localstack.compose images     # base images: pull, or stand-ins built
                                                     # from Debian packages (no registry)
    python -m services.localstack.compose build      # images + meridian:dev
    python -m services.localstack.compose chaos [--scenario worker-killed ...] [--clients 8]
                                                     # up, each fault under load, the figures,
                                                     # down (README "Deploying")

The engine: ``DOCKER_HOST``, else /var/run/docker.sock, else (root, dockerd installed) a
private engine under build/docker that stops when the command ends. Exit 0 on success, 1
when something failed (one line says what), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Sequence

from services.common import cli, logs
from services.localstack.compose.chaos import HEADER, SCENARIOS, run_scenario
from services.localstack.compose.engine import Engine, EngineUnavailable, find_engine
from services.localstack.compose.stack import REPO, ComposeFailed, ComposeStack, base_images
from services.localstack.compose.standin import default_cache_dir, ensure_base_images

CHAOS_OVERLAY = REPO / "deploy/compose/chaos.yml"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m services.localstack.compose",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--state-dir", type=cli.output_dir, default=REPO / "build/docker")
    parser.add_argument("--cache-dir", type=cli.output_dir, default=default_cache_dir())
    parser.add_argument(
        "--base-image", help="BASE_IMAGE build argument (default: the Dockerfile's)"
    )
    parser.add_argument("--pip-index-url", default="", help="PIP_INDEX_URL build argument")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("images", help="make the base images present")
    commands.add_parser("build", help="base images, then meridian:dev")
    chaos = commands.add_parser("chaos", help="faults under load on a fresh stack")
    chaos.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS), help="repeatable (default: all)"
    )
    chaos.add_argument("--clients", type=cli.positive_int, default=8)
    chaos.add_argument("--max-tokens", type=cli.positive_int, default=64)
    chaos.add_argument("--fault-s", type=cli.positive_float, default=6.0)
    return parser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prepare(engine: Engine, args: argparse.Namespace) -> dict[str, str]:
    tags = base_images(REPO / "deploy/docker/Dockerfile", REPO / "docker-compose.yml")
    if args.base_image:
        tags = [args.base_image, *tags[1:]]
    return ensure_base_images(engine.client, tags, cache_dir=args.cache_dir)


async def chaos(engine: Engine, args: argparse.Namespace) -> int:
    debug_port = free_port()
    stack = ComposeStack(
        engine,
        edge_port=free_port(),
        extra_files=[CHAOS_OVERLAY],
        env={"ROUTER_DEBUG_PORT": str(debug_port)},
    )
    stack.build(base_image=args.base_image, pip_index_url=args.pip_index_url)
    failed = 0
    try:
        print(f"up in {stack.up():.1f}s (project {stack.project}, edge {stack.edge_url})")
        stack.keys("tenant", "create", "chaos")
        key = _key_of(stack.keys("key", "create", "chaos"))
        print(HEADER)
        for name in args.scenario or list(SCENARIOS):
            figures = await run_scenario(
                stack,
                SCENARIOS[name],
                key=key,
                debug_url=f"http://127.0.0.1:{debug_port}",
                clients=args.clients,
                max_tokens=args.max_tokens,
                fault_s=args.fault_s,
            )
            print(figures.row(), flush=True)
            for why in figures.failures:
                print(f"    {why}")
            failed += figures.failed
    finally:
        stack.down()
    return 1 if failed else 0


def _key_of(output: str) -> str:
    import json

    start = output.index("{")
    return str(json.loads(output[start : output.rindex("}") + 1])["key"])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure("compose", "warning")
    try:
        engine = find_engine(state_dir=args.state_dir)
    except EngineUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    try:
        for tag, how in prepare(engine, args).items():
            print(f"{tag}: {how}")
        if args.command == "build":
            stack = ComposeStack(engine)
            took = stack.build(base_image=args.base_image, pip_index_url=args.pip_index_url)
            print(f"meridian:dev built in {took:.1f}s")
        elif args.command == "chaos":
            return asyncio.run(chaos(engine, args))
        return 0
    except (ComposeFailed, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        engine.close()


if __name__ == "__main__":
    sys.exit(main())
