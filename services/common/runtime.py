"""Process entry points: event loop, signals and the ready file.

Every service's ``__main__`` calls :func:`run`, which installs uvloop, turns SIGTERM and SIGINT
into a stop event the service awaits (graceful shutdown: stop accepting, drain, exit), and makes
a second signal exit at once. A service announces it is listening by writing a small JSON
*ready file* (its bound ports) atomically, so a supervisor can start it on port 0 without racing
for free ports.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop


def run(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``serve(stop)`` until it returns; SIGTERM/SIGINT set ``stop``."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals_seen = 0

        def on_signal() -> None:
            nonlocal signals_seen
            signals_seen += 1
            if signals_seen > 1:
                os._exit(130)  # second Ctrl-C: the user means it
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        await serve(stop)

    uvloop.run(main())


def write_ready_file(path: Path | None, info: dict[str, Any]) -> None:
    """Atomically write ``info`` as JSON to ``path`` (no-op when ``path`` is None)."""
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **info}))
    os.replace(tmp, path)
