"""Signals: SIGTERM drains (repeats ignored), a second SIGINT exits at once. Real processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

SERVICE = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from services.common import runtime

    async def serve(stop):
        Path(sys.argv[1]).write_text("up")
        await stop.wait()
        await asyncio.sleep(0.5)  # draining
        print("drained", flush=True)

    runtime.run(serve)
    """
)


def start(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(ready)], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert time.monotonic() < deadline, "the service did not start"
        time.sleep(0.02)
    return proc, ready


def test_repeated_sigterms_still_drain(tmp_path: Path) -> None:
    proc, _ = start(tmp_path)
    for _ in range(3):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "drained" in out


def test_a_second_ctrl_c_exits_at_once(tmp_path: Path) -> None:
    proc, _ = start(tmp_path)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 130
    assert "drained" not in out


SETTLE = textwrap.dedent(
    """
    import gc, weakref
    from services.common import runtime

    startup = [[i] for i in range(50_000)]  # what start-up builds and keeps
    runtime.settle_gc()
    print(gc.get_threshold()[0], gc.get_freeze_count() >= 50_000)

    class Node:
        pass

    freed = 0
    def on_free():
        global freed
        freed += 1

    for _ in range(30_000):  # request garbage in cycles, never collected by hand
        a, b = Node(), Node()
        a.other, b.other = b, a
        weakref.finalize(a, on_free)
    print(freed > 20_000)
    """
)


def test_settled_gc_freezes_startup_objects_and_still_collects_young_cycles() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SETTLE], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["10000", "True", "True"]
