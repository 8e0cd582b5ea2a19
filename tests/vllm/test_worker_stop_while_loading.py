"""SIGTERM while the model is still loading: the worker stops promptly and leaves no engine
process. It used to wait for the whole engine start-up (the build thread blocks in vLLM's
handshake while the engine core loads and warms up; the interpreter joins that thread at
exit): ~21 s on a quiet machine, 46 s on a busy one."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.support.stackproc import alive
from tests.vllm.procs import descendants, start_vllm_worker

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

#: Generous: a prompt stop takes about a second; waiting for the engine took 20-46 s.
PROMPTLY_S = 10.0
#: How long an engine process may outlive the worker by (it exits when it sees its parent go).
LEFTOVER_S = 10.0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return f"pid {pid}"


def test_sigterm_while_loading_stops_promptly_and_leaves_no_engine_process(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    worker = start_vllm_worker(model_dir=tiny_model_dir, served_name="tiny-stop", workdir=tmp_path)
    try:
        # Listening, loading: wait until the engine core process exists.
        deadline = time.monotonic() + 60
        while not descendants(worker.proc.pid):
            assert worker.proc.poll() is None, worker.log_text()[-3000:]
            assert time.monotonic() < deadline, "no engine process appeared"
            time.sleep(0.05)
        engine = descendants(worker.proc.pid)
        started = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        code = worker.proc.wait(timeout=60)
        took = time.monotonic() - started
        assert code == 0, worker.log_text()[-3000:]
        assert took < PROMPTLY_S, f"took {took:.1f} s to stop"
        # The engine core's own helpers (grandchildren) see their parent go and exit a moment
        # after the worker does: gone within seconds, none left behind.
        left = [pid for pid in engine if alive(pid)]
        deadline = time.monotonic() + LEFTOVER_S
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [pid for pid in left if alive(pid)]
        assert not left, [_cmdline(pid) for pid in left]
        assert "start abandoned" in worker.log_text()
    finally:
        worker.stop()
