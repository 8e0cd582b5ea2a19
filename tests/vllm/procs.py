"""Real worker processes for the vLLM tests: start, find their engine processes, end them all.

A vLLM worker spawns its engine core (and the engine core its model worker); those processes
share the worker's process group when it is started in a session of its own, which is how
these helpers find them and make sure none outlives a test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    address: str
    log: Path
    metrics_port: int | None = None  # with --metrics-port

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (graceful drain), then SIGKILL whatever is left of its process group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def start_vllm_worker(
    *,
    model_dir: Path,
    served_name: str,
    workdir: Path,
    extra: list[str] | None = None,
    listen_timeout_s: float = 120.0,
    nice: int = 0,
) -> WorkerProcess:
    """``python -m services.worker --engine vllm`` with the CPU settings; returns once it listens
    (the engine is still loading then).

    ``nice``: the worker's scheduling niceness, set before it spawns its engine core (which
    inherits it). A test that must act *while* the worker generates (kill it mid-stream) runs
    it at a lower priority than the test process, so that on a loaded 2-core host the engine's
    busy cores cannot starve the edge and client until the whole stream is generated."""
    ready = workdir / "worker.ready"
    log = workdir / "worker.log"
    ready.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "services.worker",
        "--engine",
        "vllm",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--worker-id",
        "kr-vllm-1",
        "--region",
        "kr",
        "--dtype",
        "float32",
        "--max-num-seqs",
        "16",
        "--gpu-memory-utilization",
        "0.15",
        "--enforce-eager",
        "--report-interval-ms",
        "50",
        "--ready-file",
        str(ready),
        *(extra or []),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    if nice:
        os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
    deadline = time.monotonic() + listen_timeout_s
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError(f"the worker did not listen:\n{log.read_text()[-4000:]}")
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    return WorkerProcess(proc, f"127.0.0.1:{info['port']}", log, info.get("metrics_port"))


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, their children...), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found
