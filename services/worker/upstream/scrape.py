"""Queue and KV-cache use read from a vLLM upstream's Prometheus ``/metrics``.

What the worker has in flight says how busy the upstream is *for this worker*; a vLLM server
also knows its own queue (other clients included) and KV-cache use, which the router's
scorers want. Read every ``scrape_interval_s`` in the background, never on a load report's
path. Summed over label sets (several models or engines behind one server). A server whose
``/metrics`` has none of vLLM's gauges (SGLang, a proxy, the bench's fake) is not vLLM: the
engine stops asking.

Gauge names as of vLLM 0.32: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` (older releases: ``vllm:gpu_cache_usage_perc``).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
MAX_METRICS_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class UpstreamLoad:
    running: int
    waiting: int
    kv_cache_usage: float


def parse_vllm_metrics(text: str) -> UpstreamLoad | None:
    """vLLM's load gauges from a ``/metrics`` page; None when the page has none of them."""
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == _RUNNING or sample.name == _WAITING or sample.name in _KV:
                    values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    except ValueError:
        return None
    if _RUNNING not in values and _WAITING not in values:
        return None
    kv = next((values[k] for k in _KV if k in values), 0.0)
    return UpstreamLoad(
        running=int(values.get(_RUNNING, 0)),
        waiting=int(values.get(_WAITING, 0)),
        kv_cache_usage=min(max(kv, 0.0), 1.0),
    )
