"""Child processes of the local stack: started in their own session, tied to the supervisor's
life, logging to a file, and announcing readiness through a ready file.

No orphans: each child gets ``PR_SET_PDEATHSIG = SIGTERM`` (Linux), so even a supervisor killed
with SIGKILL takes its children down; a normal stop sends SIGTERM (graceful drain), then SIGKILL
after a grace period. Each child leads its own process group, and ``stop()`` ends whatever is
left in that group once the child itself has exited: a vLLM worker's engine core (a process
vLLM spawns, which does not watch its parent) would otherwise outlive a worker that crashed or
was killed, holding gigabytes of memory (GPU memory on a GPU host).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class ProcessFailed(RuntimeError):
    """A child exited or did not become ready; the message carries its last log lines."""


class ManagedProcess:
    def __init__(
        self,
        *,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        ready_file: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.ready_file = ready_file
        self._env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.ready_info: dict[str, Any] = {}
        self._log_start = 0  # where this run's output begins (the log is appended to)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        if self.ready_file is not None:
            self.ready_file.unlink(missing_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self._log_start = log.tell()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                env={**os.environ, **(self._env or {})},
            )
        finally:
            log.close()

    async def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the ready file (JSON); fail fast if the process exits first."""
        assert self.proc is not None and self.ready_file is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                raise ProcessFailed(
                    f"{self.name} exited with code {self.proc.returncode}:\n{self.log_tail()}"
                )
            if self.ready_file.exists():
                self.ready_info = json.loads(self.ready_file.read_text())
                return self.ready_info
            await asyncio.sleep(0.02)
        raise ProcessFailed(f"{self.name} was not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        await self._end_group(grace_s=min(grace_s, 5.0))
        return self.proc.returncode

    async def _end_group(self, grace_s: float) -> None:
        """SIGTERM what outlived the child in its process group, SIGKILL it after ``grace_s``.

        The group id is the child's pid (``start_new_session``); the kernel does not reuse a
        pid while a group of that id has members, so this never signals a stranger.
        """
        assert self.proc is not None
        group = self.proc.pid
        if not _group_alive(group):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        # Polled: nothing notifies us when processes we are not the parent of exit.
        while _group_alive(group) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines this run wrote (earlier runs' output stays in the file)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_start)
                text = f.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"
