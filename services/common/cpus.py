"""How many cores this process may really use (``--workers auto``, ``--jobs auto``)."""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use, not the machine's total: its affinity mask (which
    ``taskset`` and cpusets narrow), and its cgroup's CPU quota where one is set — a container
    limited to 2 CPUs on a 64-core node (Kubernetes ``limits.cpu``, ``docker --cpus``) gets 2
    processes from ``auto``, not 64 that the quota would throttle in turn."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cores = max(1, os.cpu_count() or 1)
    quota = cgroup_cpu_quota(cgroup_root)
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs' worth of time the cgroup may use (quota / period), or None when unlimited or
    unknown. cgroup v2: ``cpu.max`` ("max 100000" or "200000 100000"); v1:
    ``cpu/cpu.cfs_quota_us`` (-1: unlimited) over ``cpu/cpu.cfs_period_us``."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period) if int(period) > 0 else None
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None
