"""GPU utilisation and memory from NVML, for the worker's load reports; nothing on a CPU host.

Uses ``pynvml`` (the ``nvidia-ml-py`` package) when it is importable and NVML initialises (a
driver is present). Otherwise :meth:`GpuMonitor.stats` returns an empty tuple: hosts without a
GPU report no GPUs, they do not fail.

Only the GPUs this process may use are reported: ``CUDA_VISIBLE_DEVICES`` (indices or
``GPU-…``/``MIG-…`` UUIDs) selects them, as it does for vLLM; unset means all. Indices in the
report are NVML's (physical) indices.

- ``utilization``: NVML's "percent of time over the past sample period during which one or
  more kernels was executing", as a fraction 0..1 (a busy-ness signal, not FLOPs).
- ``memory_used_fraction``: used / total device memory, 0..1. With vLLM this is mostly the
  memory it reserved at start (weights + KV cache pool); KV-cache *use* is reported separately.

One reading is reused for ``max_age_s`` seconds, so ``load()`` stays cheap when many load
streams read it.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Sequence
from typing import Any

from services.common.clock import SYSTEM_CLOCK, Clock
from services.worker.engine import GpuStat

log = logging.getLogger(__name__)


def parse_visible_devices(value: str | None) -> tuple[str, ...] | None:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value; None when every GPU is visible.

    An empty value hides every GPU (``()``), as CUDA does. CUDA stops at the first invalid
    entry; so does this (``"0,1,-1,2"`` selects 0 and 1).
    """
    if value is None:
        return None
    entries: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return tuple(entries)


def _selected(index: int, uuid: str, visible: Sequence[str] | None) -> bool:
    if visible is None:
        return True
    for entry in visible:
        if entry.isdigit() and int(entry) == index:
            return True
        if not entry.isdigit() and uuid.startswith(entry):
            return True
    return False


class GpuMonitor:
    """Reads NVML on demand (at most once per ``max_age_s``); empty where there is no NVML."""

    def __init__(
        self,
        *,
        clock: Clock = SYSTEM_CLOCK,
        max_age_s: float = 1.0,
        visible_devices: str | None = None,
    ) -> None:
        self._clock = clock
        self._max_age_s = max_age_s
        self._visible = parse_visible_devices(
            visible_devices
            if visible_devices is not None
            else os.environ.get("CUDA_VISIBLE_DEVICES")
        )
        self._nvml: Any = None
        self._handles: list[tuple[int, Any]] = []
        self._cached: tuple[GpuStat, ...] = ()
        self._read_at: float | None = None
        self._opened = False

    @property
    def available(self) -> bool:
        """Whether NVML is usable here (opens it on first call)."""
        self._open()
        return self._nvml is not None

    def stats(self) -> tuple[GpuStat, ...]:
        """One :class:`GpuStat` per visible GPU; ``()`` without NVML."""
        self._open()
        if self._nvml is None:
            return ()
        now = self._clock.monotonic()
        if self._read_at is not None and now - self._read_at < self._max_age_s:
            return self._cached
        self._cached = self._read()
        self._read_at = now
        return self._cached

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as err:
                log.debug("nvmlShutdown failed: %s", err)
        self._nvml = None
        self._handles = []

    def _open(self) -> None:
        if self._opened:
            return
        self._opened = True
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            log.debug("pynvml is not installed; no GPU stats")
            return
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            handles = []
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                if _selected(index, uuid, self._visible):
                    handles.append((index, handle))
        except nvml.NVMLError as err:
            log.info("NVML unavailable (%s); no GPU stats", err)
            return
        self._nvml = nvml
        self._handles = handles

    def _read(self) -> tuple[GpuStat, ...]:
        nvml = self._nvml
        out: list[GpuStat] = []
        for index, handle in self._handles:
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError as err:
                # A GPU that cannot be read (fallen off the bus, MIG reconfigured) is left
                # out of this report rather than failing the whole load report.
                log.warning("NVML read of GPU %d failed: %s", index, err)
                continue
            total = float(mem.total)
            out.append(
                GpuStat(
                    index=index,
                    utilization=min(1.0, max(0.0, float(util.gpu) / 100.0)),
                    memory_used_fraction=float(mem.used) / total if total > 0 else 0.0,
                )
            )
        return tuple(out)
