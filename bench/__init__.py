"""Benchmarks: ``python -m bench.NAME`` (bench/README.md lists them and their results).

Ctrl-C ends any of them with one line, not a traceback: each bench's own clean-up (its
``finally`` blocks, the stacks it started) has run by the time the interrupt reaches the top,
and the process still ends as interrupted (by SIGINT: exit status 130 in a shell).
"""

from __future__ import annotations

import sys
from types import TracebackType

_previous_hook = sys.excepthook


def _interrupted_in_one_line(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    if issubclass(kind, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return
    _previous_hook(kind, value, tb)


sys.excepthook = _interrupted_in_one_line
