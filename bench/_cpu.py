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


def own_cpu_seconds(pid: int) -> float:
    """CPU time used so far by ``pid`` itself (all its threads, none of its children): what a
    server's frontend costs, apart from an engine process it spawned. 0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
