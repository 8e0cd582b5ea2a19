"""Commands that a test interrupts the way a user's Ctrl-C would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_module(*argv: str) -> subprocess.Popen[str]:
    """``python -m argv...`` from the repository, its output piped, ready for SIGINT: a
    shell's background job ignores SIGINT and a child would inherit that, so the child gets
    the default disposition back (Python then turns SIGINT into KeyboardInterrupt)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'build' / 'gen'}"}
    return subprocess.Popen(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
