"""GPU stats: which GPUs CUDA_VISIBLE_DEVICES selects, and a clean absence without NVML."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from services.common.clock import ManualClock
from services.worker.gpu import GpuMonitor, parse_visible_devices


@pytest.mark.parametrize(
    ("value", "entries"),
    [
        (None, None),
        ("", ()),
        ("0", ("0",)),
        ("0, 2", ("0", "2")),
        ("1,-1,2", ("1",)),
        ("GPU-8a1c,MIG-77", ("GPU-8a1c", "MIG-77")),
    ],
)
def test_visible_devices_are_parsed_as_cuda_does(
    value: str | None, entries: tuple[str, ...] | None
) -> None:
    assert parse_visible_devices(value) == entries


def test_without_nvml_bindings_there_are_no_gpus() -> None:
    """nvidia-ml-py is a pinned dependency; a host without it is a process where importing
    pynvml fails (``sys.modules[name] = None`` makes the import raise ImportError)."""
    code = (
        "import sys; sys.modules['pynvml'] = None\n"
        "from services.common.clock import ManualClock\n"
        "from services.worker.gpu import GpuMonitor\n"
        "m = GpuMonitor(clock=ManualClock())\n"
        "print(m.available, m.stats())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False ()"


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="no NVML bindings")
def test_with_nvml_bindings_gpus_report_fractions_or_none_without_a_driver() -> None:
    monitor = GpuMonitor(clock=ManualClock())
    try:
        available = monitor.available
        stats = monitor.stats()
    finally:
        monitor.close()

    if not available:  # bindings installed on a host without the NVIDIA driver
        assert stats == ()
        return
    assert stats
    for stat in stats:
        assert 0.0 <= stat.utilization <= 1.0
        assert 0.0 <= stat.memory_used_fraction <= 1.0
