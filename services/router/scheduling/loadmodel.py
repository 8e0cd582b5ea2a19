"""What "a worker at 95 % load" means: one definition shared by admission, scoring and
session affinity.

    slot_pressure = (running + waiting + in_flight) / max_running
    load          = max(slot_pressure, kv_cache_usage[, gpu_utilization])

Intent: a worker is as loaded as its tightest resource. An inference engine admits a new
sequence only when it has a free batch slot (``max_running`` concurrent sequences) *and* free
KV-cache blocks; queued requests (``waiting``) and requests this router assigned but the worker
has not reported yet (``in_flight``) will take slots before a new one does, so they count as
occupied. A mean would let a full KV cache hide behind idle slots (or the reverse).

GPU utilisation is left out by default: NVML's figure is the share of time a kernel ran, which
sits near 100 % for a healthily batching worker, so it says "busy", not "full". Profiles can
fold it in (``include_gpu``) for engines whose batch accounting is not reported.

``load`` can exceed 1.0 (a queue longer than the batch); scorers clamp, admission compares.
"""

from __future__ import annotations

from services.router.scheduling.types import WorkerSnapshot


def slot_pressure(w: WorkerSnapshot) -> float:
    """Occupied and promised batch slots over batch capacity (0 = idle; > 1 = queueing)."""
    return (w.running + w.waiting + w.in_flight) / (w.max_running if w.max_running > 0 else 1)


def worker_load(w: WorkerSnapshot, include_gpu: bool = False) -> float:
    """The worker's load: the tightest of its batch slots and KV cache (and GPU, if asked)."""
    slots = (w.running + w.waiting + w.in_flight) / (w.max_running if w.max_running > 0 else 1)
    load = slots if slots > w.kv_cache_usage else w.kv_cache_usage
    if include_gpu and w.gpu_utilization is not None and w.gpu_utilization > load:
        return w.gpu_utilization
    return load


def describe_load(w: WorkerSnapshot, include_gpu: bool = False) -> str:
    """``slots=18+1+0/20 kv=0.62`` — the inputs behind :func:`worker_load` (running + waiting
    + in-flight over capacity, KV-cache use, and GPU use when it counts)."""
    text = f"slots={w.running}+{w.waiting}+{w.in_flight}/{w.max_running} kv={w.kv_cache_usage:.2f}"
    if include_gpu and w.gpu_utilization is not None:
        text += f" gpu={w.gpu_utilization:.2f}"
    return text
