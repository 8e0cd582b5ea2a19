"""``python -m services.edge --workers N``: N edge processes serving one port.

One edge process is one core: its event loop does the HTTP parsing, the SSE writes and the
gRPC reads of every stream it relays. To use every core of a machine, the supervisor starts
``N`` copies of the edge, each with its own event loop, all listening on the same port with
``SO_REUSEPORT`` so the kernel spreads new connections over them (by a hash of the
connection's addresses). They share nothing in memory: rate limits, keys, tenants and console
sessions live in Redis, routing in the router, so any process can serve any request.

Why processes started afresh (``python -m services.edge …``) rather than ``fork()``: a child
started from scratch has no inherited event loop, gRPC or OpenTelemetry state to be unsafe
about, and a crashed one is replaced the same way it was first started.

What the supervisor does:

- **One port for all.** With ``--port 0`` it binds a ``SO_REUSEPORT`` socket first to learn a
  free port (kept bound, never listening, so no other program takes the number while the
  children come and go) and gives that port to every child. A port another program already
  holds fails here, once, with the usual clear line.
- **Per-process listeners for the rest.** Child ``i`` serves the admin API on
  ``--admin-port + i`` and metrics on ``--metrics-port + i`` (0 stays "any free port"), so
  each process's counters can be scraped on their own; the ready file lists them all.
- **Limits per process.** Connection, stream and per-address limits (``--max-connections``,
  ``--max-streams-per-ip``, ``--ip-requests-per-s`` …) apply to each process, as each protects
  its own memory and loop. ``--local-limit-share`` (the share of a tenant's limits an edge
  grants on its own while Redis is down) is divided by ``N``, so the machine as a whole grants
  the share the flag says.
- **Readiness.** The supervisor's ready file is written once every child has written its own.
- **Crashes.** A child that exits after it was ready is started again (after 0.5 s, doubling
  up to 30 s while it keeps failing within a minute of its start); one that exits before it
  was ever ready stops the whole edge with its status — its own error line says why (a bad
  certificate, an unreachable Redis).
- **Signals.** SIGTERM and SIGINT are passed to every child, which drains as a single edge
  does; the supervisor waits for them (``--drain-grace-s`` plus a margin, then SIGKILL) and
  exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from services.common import runtime
from services.common.cpus import usable_cpus
from services.common.logs import event
from services.common.startup import StartupError, listen_failed

log = logging.getLogger("meridian.edge.supervisor")

#: ``--workers auto`` never starts more than this many processes.
MAX_AUTO_WORKERS = 32
#: How long past the drain grace the supervisor waits before it kills what is left. A child
#: ends its drain about a second past the grace (services/edge/server.py: CUT_WAIT_S), then
#: closes its clients (settles still in flight get up to 2 s); this covers both with room.
STOP_MARGIN_S = 5.0
RESTART_BACKOFF_S = (0.5, 30.0)
#: A child that lived this long before it failed is restarted with the shortest backoff.
STABLE_AFTER_S = 60.0
PR_SET_PDEATHSIG = 1


def parse_workers(value: str) -> int:
    """``--workers``: a count, or ``auto`` (the usable cores, at most
    :data:`MAX_AUTO_WORKERS`)."""
    if value == "auto":
        return min(usable_cpus(), MAX_AUTO_WORKERS)
    if not value.isdigit() or not 1 <= int(value) <= 256:
        raise ValueError(f"must be 'auto' or a count 1..256, got {value!r}")
    return int(value)


def offset_port(port: int | None, index: int) -> int | None:
    """Child ``index``'s port for a per-process listener: ``port + index``; 0 and None stay."""
    if port is None or port == 0:
        return port
    return port + index


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, never-listening ``SO_REUSEPORT`` socket on ``host:port`` (0: a free port),
    kept for the supervisor's life: it holds the number for the children, and it fails at once
    when another program owns the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise listen_failed("the public API", host, port, err) from None
    return sock


@dataclass
class Child:
    index: int
    ready_file: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    ready: bool = False
    backoff_s: float = RESTART_BACKOFF_S[0]
    restart_at: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorConfig:
    argv: tuple[str, ...]  # the edge's own arguments, as given
    workers: int
    host: str
    port: int
    admin_port: int | None
    metrics_port: int | None
    ready_file: Path | None
    drain_grace_s: float


class Supervisor:
    def __init__(self, config: SupervisorConfig) -> None:
        self.config = config
        self._stopping = False
        self._signal: int | None = None
        self._reservation: socket.socket | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="meridian-edge-"))
        self.port = config.port
        self.children = [Child(i, self._dir / f"edge-{i}.json") for i in range(config.workers)]

    def child_argv(self, child: Child) -> list[str]:
        """The child's command line: the supervisor's own arguments with this process's port,
        listeners, index and ready file appended (argparse keeps the last of each)."""
        cfg = self.config
        argv = [sys.executable, "-m", "services.edge", *cfg.argv]
        argv += ["--port", str(self.port), "--ready-file", str(child.ready_file)]
        argv += ["--process-index", str(child.index), "--process-count", str(cfg.workers)]
        admin = offset_port(cfg.admin_port, child.index)
        if admin is not None:
            argv += ["--admin-port", str(admin)]
        metrics = offset_port(cfg.metrics_port, child.index)
        if metrics is not None:
            argv += ["--metrics-port", str(metrics)]
        return argv

    def _start(self, child: Child) -> None:
        child.ready_file.unlink(missing_ok=True)
        child.ready = False
        child.restart_at = None
        child.started_at = time.monotonic()
        # Its own process group: a Ctrl-C in the terminal reaches the supervisor only, which
        # passes it on once (a second SIGINT would make a child skip its drain).
        child.proc = subprocess.Popen(
            self.child_argv(child), process_group=0, preexec_fn=_die_with_parent
        )
        event(log, "edge.process_started", index=child.index, pid=child.proc.pid)

    def run(self) -> int:
        """Start the children, keep them running, stop them on SIGTERM/SIGINT. The exit
        status is 0 after a requested stop, else the status of the child that failed."""
        self._reservation = reserve_port(self.config.host, self.config.port)
        self.port = int(self._reservation.getsockname()[1])
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for child in self.children:
                self._start(child)
            status = self._watch()
        finally:
            self._stop_all()
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._reservation.close()
            for child in self.children:
                child.ready_file.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self._dir.rmdir()
        return status

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._stopping and signum == signal.SIGINT:
            os._exit(130)  # second Ctrl-C: the user means it (as a single edge does)
        self._stopping = True
        self._signal = signum

    def _watch(self) -> int:
        announced = False
        while not self._stopping:
            now = time.monotonic()
            for child in self.children:
                status = self._check(child, now)
                if status is not None:
                    return status
            if not announced and all(c.ready for c in self.children):
                announced = True
                self._announce()
            time.sleep(0.05)
        return 0

    def _check(self, child: Child, now: float) -> int | None:
        """One look at a child: note readiness, restart it when due; a status to exit with
        when it failed before it was ever ready."""
        if child.proc is None:
            if child.restart_at is not None and now >= child.restart_at:
                self._start(child)
            return None
        code = child.proc.poll()
        if code is None:
            if not child.ready and child.ready_file.exists():
                child.info = json.loads(child.ready_file.read_text())
                child.ready = True
                event(log, "edge.process_ready", index=child.index, pid=child.proc.pid)
            return None
        if not child.ready and not child.info:
            event(
                log,
                "edge.process_failed_to_start",
                level=logging.ERROR,
                index=child.index,
                status=code,
            )
            return code or 1
        lived = now - child.started_at
        child.backoff_s = (
            RESTART_BACKOFF_S[0]
            if lived >= STABLE_AFTER_S
            else min(child.backoff_s * 2, RESTART_BACKOFF_S[1])
        )
        child.proc = None
        child.ready = False
        child.restart_at = now + child.backoff_s
        event(
            log,
            "edge.process_exited",
            level=logging.WARNING,
            index=child.index,
            status=code,
            lived_s=round(lived, 1),
            restart_in_s=child.backoff_s,
        )
        return None

    def _announce(self) -> None:
        infos = [c.info for c in self.children]
        first = infos[0]
        runtime.write_ready_file(
            self.config.ready_file,
            {
                "port": self.port,
                "host": first.get("host"),
                "scheme": first.get("scheme"),
                "admin_port": first.get("admin_port"),
                "metrics_port": first.get("metrics_port"),
                "processes": [
                    {k: i.get(k) for k in ("pid", "admin_port", "metrics_port")} for i in infos
                ],
            },
        )
        event(log, "edge.listening", port=self.port, processes=len(infos))

    def _stop_all(self) -> None:
        live = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        sig = self._signal or signal.SIGTERM
        for proc in live:
            with contextlib.suppress(OSError):
                proc.send_signal(sig)
        deadline = time.monotonic() + self.config.drain_grace_s + STOP_MARGIN_S
        for proc in live:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                event(log, "edge.process_killed", level=logging.WARNING, pid=proc.pid)
                proc.kill()
                proc.wait()


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies, however it dies (Linux's
    ``PR_SET_PDEATHSIG``), so a killed supervisor leaves no edge behind holding the port."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def supervise(config: SupervisorConfig) -> int:
    """Run the edge as ``config.workers`` processes; a start-up failure of the supervisor
    itself (the port is taken) is one line on stderr and status 1, as for a single edge."""
    try:
        return Supervisor(config).run()
    except StartupError as err:
        print(f"python -m services.edge: error: {err}", file=sys.stderr, flush=True)
        return 1


def strip_workers(argv: Sequence[str]) -> tuple[str, ...]:
    """``argv`` without ``--workers`` (``--workers N`` and ``--workers=N``): the children are
    single edges."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers="):
            continue
        out.append(arg)
    return tuple(out)
