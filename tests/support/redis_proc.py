"""A real redis-server for tests, on a free port, never the machine's shared 6379."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from services.common.net import free_port


class RedisProcess:
    def __init__(self, workdir: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is required for the tests")
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self._binary = binary
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                self._binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def flush(self) -> None:
        client = redis.Redis.from_url(self.url)
        client.flushall()
        client.close()
