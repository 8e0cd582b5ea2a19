"""CPU time of process trees, read from /proc: what the benchmarks charge each system for."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def cpu_seconds(roots: Sequence[int]) -> float:
    """CPU time used so far by ``roots`` and every process below them (from /proc)."""
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
        used[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree = set(roots)
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in tree} - tree
        grew = bool(children)
        tree |= children
    return sum(used.get(pid, 0.0) for pid in tree)
