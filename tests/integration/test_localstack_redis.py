"""The local stack's own Redis keeps what it holds across a restart on the same run directory
(an append-only file, as docker-compose.yml's Redis): the demo key printed by ``make run``
keeps working after Redis is restarted."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from services.localstack.redis_server import RedisServer


async def test_what_redis_holds_survives_a_restart_on_the_same_run_dir(tmp_path: Path) -> None:
    first = RedisServer(run_dir=tmp_path / "redis")
    await first.start()
    try:
        client = aioredis.Redis.from_url(first.url)
        await client.set("meridian:test:key", "kept")
        await client.aclose()
    finally:
        await first.stop()
    second = RedisServer(run_dir=tmp_path / "redis")
    await second.start()
    try:
        client = aioredis.Redis.from_url(second.url)
        assert await client.get("meridian:test:key") == b"kept"
        await client.aclose()
    finally:
        await second.stop()
