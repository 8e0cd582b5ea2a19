"""Process entry points: event loop, signals and the ready file.

Every service's ``__main__`` calls :func:`run`, which installs uvloop, turns SIGTERM and SIGINT
into a stop event the service awaits (graceful shutdown: stop accepting, drain, exit). A second
Ctrl-C (SIGINT) exits at once — the user means it. Repeated SIGTERMs are ignored: supervisors
deliver them in bursts (``make`` forwards its own SIGTERM while the process group also gets
one; a parent's death signal follows), and exiting on the second one would skip the drain and
orphan children such as vLLM's engine core.

A service announces it is listening by writing a small JSON *ready file* (its bound ports)
atomically, so a supervisor can start it on port 0 without racing for free ports.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

from services.common.startup import StartupError


def run(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``serve(stop)`` until it returns; SIGTERM/SIGINT set ``stop``. A
    :class:`StartupError` ends the process with one line on stderr and status 1."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_sigterm() -> None:
            stop.set()

        def on_sigint() -> None:
            if stop.is_set():
                os._exit(130)  # second Ctrl-C: the user means it
            stop.set()

        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        await serve(stop)

    try:
        uvloop.run(main())
    except StartupError as err:
        print(f"{_program()}: error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _program() -> str:
    """How the service was started, for error lines: ``python -m services.edge``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = spec.name.removesuffix(".__main__") if spec is not None else ""
    return f"python -m {name}" if name else Path(sys.argv[0]).name


#: Collect the youngest generation after this many net allocations of container objects
#: instead of CPython's default 700. A request allocates hundreds of short-lived objects (more
#: with tracing on) that reference counting frees by the time the request ends; at 700 the
#: collector ran every few requests to find nothing (0.5 ms each: 114 ms of the edge's CPU per
#: 1,500 traced requests, ~75 µs a request). At 10,000 it runs about once per 1,500 requests.
#: Cycles are still collected, a little later; the youngest generation stays a few MB at most.
GC_GEN0_THRESHOLD = 10_000


def settle_gc() -> None:
    """Call once a service has started: freeze what start-up built (configuration, gRPC and
    protobuf modules, the app) out of the collector's reach — it lives as long as the process,
    so scanning it again in every full collection is wasted — and collect young objects less
    often (:data:`GC_GEN0_THRESHOLD`)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def write_ready_file(path: Path | None, info: dict[str, Any]) -> None:
    """Atomically write ``info`` as JSON to ``path`` (no-op when ``path`` is None)."""
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **info}))
    os.replace(tmp, path)
