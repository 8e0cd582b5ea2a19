"""A real ``redis-server`` on a free port for the local stack, never the machine's shared
Redis on 6379. It keeps an append-only file in its run directory (as docker-compose.yml's
Redis does), so the demo key and any tenants made through the admin API survive a restart of
Redis on the same run directory."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import redis.asyncio as aioredis
import redis.exceptions

from services.common.net import free_port
from services.localstack.procs import ManagedProcess, ProcessFailed


class RedisServer:
    def __init__(self, *, run_dir: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ProcessFailed("redis-server is not on PATH (install Redis, or set REDIS_URL)")
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        run_dir.mkdir(parents=True, exist_ok=True)
        self.process = ManagedProcess(
            name="redis",
            argv=[
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--dir",
                str(run_dir),
                "--protected-mode",
                "yes",
            ],
            log_path=run_dir / "redis.log",
        )

    async def start(self, timeout_s: float = 10.0) -> None:
        await self.process.start()
        client = aioredis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if not self.process.alive():
                    raise ProcessFailed(f"redis-server exited:\n{self.process.log_tail()}")
                try:
                    if await client.ping():
                        return
                except redis.exceptions.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    raise ProcessFailed(f"redis-server not answering:\n{self.process.log_tail()}")
                await asyncio.sleep(0.02)
        finally:
            await client.aclose()

    async def stop(self) -> None:
        await self.process.stop(grace_s=5.0)
