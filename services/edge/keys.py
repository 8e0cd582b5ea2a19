"""``python -m services.edge.keys``: manage API keys in Redis from a shell.

    python -m services.edge.keys create --redis-url redis://127.0.0.1:6379/0 --tenant acme

``create`` prints the raw key once, on stdout; only its hash is stored.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys

import redis.asyncio as aioredis
import redis.exceptions

from services.common.clock import SYSTEM_CLOCK
from services.edge.apikeys import ApiKeyStore

_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _tenant(value: str) -> str:
    if not _TENANT_RE.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r}: 1-64 characters of letters, digits, '.', '_' or '-'"
        )
    return value


async def _create(redis_url: str, tenant: str, name: str) -> str:
    client = aioredis.Redis.from_url(redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
    try:
        raw, _ = await ApiKeyStore(redis=client, clock=SYSTEM_CLOCK).create(tenant, name)
    finally:
        await client.aclose()
    return raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.edge.keys", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="create a key for a tenant and print it")
    create.add_argument("--redis-url", required=True)
    create.add_argument("--tenant", type=_tenant, required=True)
    create.add_argument("--name", default="")
    args = parser.parse_args(argv)
    try:
        print(asyncio.run(_create(args.redis_url, args.tenant, args.name)))
    except (redis.exceptions.RedisError, ValueError) as err:
        print(f"error: cannot reach Redis at {args.redis_url}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
