"""Workers announcing themselves: one small JSON file per worker in a shared directory.

    python -m services.worker ... --ready-file /run/meridian/workers/kr-3.json
    python -m services.router ... --announce-dir /run/meridian/workers

A worker that writes its ready file into the directory joins every router watching it at the
next scan (``interval_s``, 1 s by default); deleting the file (or the worker removing it on
exit) makes the routers stop watching it. The file is the worker's own ready file, written
atomically (temp file + rename) once it listens, so no change to the worker is needed:

    {"pid": 4242, "host": "127.0.0.1", "port": 50061}      the worker's --ready-file
    {"address": "10.0.3.7:50061"}                           or any announcer's address

Why a directory, next to static addresses and DNS: it covers what DNS cannot — workers on
ports picked at start-up (port 0, the local stack), several workers per host, and hosts without
a DNS name — with nothing but a shared filesystem (a host directory, a docker volume). Across
machines without a shared volume, DNS (compose, Kubernetes) is the answer; a worker-to-router
``Announce`` RPC would be the next step (see docs/router.md).

A file is a *membership* claim only: health still comes from the worker's load stream, so a
worker killed without removing its file is down within a second and simply stays listed (and
unhealthy) until its file goes. Bad files (not JSON, no usable address, a wildcard host like
``0.0.0.0`` that no one can dial) are skipped and logged once per version of the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from services.common.logs import event
from services.common.net import parse_address
from services.router.discovery.membership import Membership

log = logging.getLogger("meridian.router.discovery")

SUFFIX = ".json"
MAX_FILE_BYTES = 64 * 1024
_WILDCARD_HOSTS = {"0.0.0.0", "::", "[::]", ""}


class AnnouncementError(ValueError):
    """An announcement file that names no address a router can dial."""


def parse_announcement(text: str) -> str:
    """The ``host:port`` an announcement names (``address``, or ``host`` + ``port``)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise AnnouncementError(f"not JSON: {err.msg} at line {err.lineno}") from None
    except (ValueError, RecursionError) as err:  # a 5,000-digit number; nesting past the stack
        raise AnnouncementError(f"not usable JSON: {err}") from None
    if not isinstance(doc, dict):
        raise AnnouncementError("must be a JSON object")
    if "address" in doc:
        value = doc["address"]
        if not isinstance(value, str):
            raise AnnouncementError("'address' must be a string HOST:PORT")
    else:
        host, port = doc.get("host"), doc.get("port")
        if not isinstance(host, str) or isinstance(port, bool) or not isinstance(port, int):
            raise AnnouncementError("needs 'address' (HOST:PORT) or 'host' (string) + 'port' (int)")
        value = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        address = parse_address(value)
    except ValueError as err:
        raise AnnouncementError(str(err)) from None
    if address.rpartition(":")[0] in _WILDCARD_HOSTS:
        raise AnnouncementError(
            f"{address}: a wildcard host cannot be dialled; announce a reachable address"
        )
    return address


@dataclass(slots=True)
class Scan:
    """One look at the directory: file name → address, and file name → why it was skipped
    (with the file's modification time, so a problem is reported once per version)."""

    addresses: dict[str, str] = field(default_factory=dict)
    problems: dict[str, tuple[float, str]] = field(default_factory=dict)
    missing: bool = False
    error: str | None = None  # the directory could not be listed (the scan tells nothing)


def scan_directory(directory: Path) -> Scan:
    """Read every ``*.json`` announcement in ``directory`` (blocking: run it in a thread)."""
    out = Scan()
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        out.missing = True
        return out
    except OSError as err:
        out.error = f"cannot list {directory}: {err.strerror or err}"
        return out
    for entry in entries:
        if not entry.name.endswith(SUFFIX) or entry.name.startswith("."):
            continue
        try:
            st = entry.stat()
            if not entry.is_file():
                continue
            if st.st_size > MAX_FILE_BYTES:
                raise AnnouncementError(f"larger than {MAX_FILE_BYTES} bytes")
            with open(entry.path, encoding="utf-8") as f:
                text = f.read(MAX_FILE_BYTES + 1)
            out.addresses[entry.name] = parse_announcement(text)
        except FileNotFoundError:
            continue  # removed between listing and reading
        except (OSError, UnicodeDecodeError) as err:
            out.problems[entry.name] = (_mtime(entry), f"unreadable: {err}")
        except AnnouncementError as err:
            out.problems[entry.name] = (_mtime(entry), str(err))
    return out


def _mtime(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat().st_mtime
    except OSError:
        return 0.0


class AnnounceDirDiscovery:
    """Scans ``directory`` every ``interval_s`` and tells :class:`Membership` (source
    ``announce``)."""

    SOURCE = "announce"

    def __init__(self, *, directory: Path, membership: Membership, interval_s: float = 1.0) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError("interval_s must be > 0")
        self._directory = directory
        self._membership = membership
        self._interval_s = interval_s
        self._reported: dict[str, tuple[float, str]] = {}
        self._missing_reported = False
        self._error: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def directory(self) -> Path:
        return self._directory

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="announce discovery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def refresh(self) -> None:
        """Scan once and update membership."""
        scan = await asyncio.to_thread(scan_directory, self._directory)
        if scan.error is not None:
            # Like a DNS hiccup: keep the last membership rather than drop every worker.
            if self._error != scan.error:
                event(
                    log, "discovery.announce_dir_failed", level=logging.WARNING, reason=scan.error
                )
            self._error = scan.error
            return
        self._error = None
        if scan.missing and not self._missing_reported:
            event(
                log,
                "discovery.announce_dir_missing",
                level=logging.WARNING,
                directory=str(self._directory),
            )
        self._missing_reported = scan.missing
        for name, problem in scan.problems.items():
            if self._reported.get(name) != problem:
                event(
                    log,
                    "discovery.announcement_invalid",
                    level=logging.WARNING,
                    file=name,
                    reason=problem[1],
                )
        self._reported = scan.problems
        self._membership.update(self.SOURCE, scan.addresses.values())

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._interval_s)
