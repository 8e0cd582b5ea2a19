"""The local stack as a user starts it: a process (``make run`` or ``python -m
services.localstack``) with a private state folder and ``EDGE_PORT=0``, so it never collides
with a stack the developer is running. ``run/stack.json`` says where everything listens."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

REPO = Path(__file__).resolve().parents[2]


@dataclass
class StackProcess:
    proc: subprocess.Popen[bytes]
    state: Path
    info: dict[str, Any]
    key: str
    log: Path

    @property
    def base_url(self) -> str:
        return f"{self.info['edge_url']}/v1"

    def client(self) -> openai.OpenAI:
        """A client of the stack's edge; use it with ``with`` so its connections close."""
        return openai.OpenAI(base_url=self.base_url, api_key=self.key, max_retries=0)

    def ports(self) -> list[int]:
        """Every port the stack listens on (edge, router, Redis, workers and their proxies)."""
        addrs = [self.info["edge_url"], self.info["router"], self.info["redis_url"].split("/")[2]]
        for w in self.info["workers"].values():
            addrs += [w["direct"], w["proxied"]]
        return sorted({int(a.rsplit(":", 1)[1]) for a in addrs})

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)


def start_stack_process(
    argv: Sequence[str],
    state: Path,
    *,
    timeout_s: float = 90.0,
    extra_env: dict[str, str] | None = None,
) -> StackProcess:
    """Start ``argv`` in the repository with a private state folder; wait for stack.json."""
    log = state / "stack.log"
    env = {**os.environ, "EDGE_PORT": "0", "MERIDIAN_STATE_DIR": str(state), **(extra_env or {})}
    env.pop("REDIS_URL", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(list(argv), cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    info_file = state / "run" / "stack.json"
    deadline = time.monotonic() + timeout_s
    while not info_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the stack did not come up:\n{log.read_text()[-4000:]}")
        time.sleep(0.1)
    info = json.loads(info_file.read_text())
    return StackProcess(proc, state, info, (state / "demo-key").read_text().strip(), log)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
