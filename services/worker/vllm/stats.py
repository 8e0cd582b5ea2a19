"""Load read from the vLLM engine itself, through its stat-logger hook.

``AsyncLLM`` calls every stat logger once per engine step, in the frontend process and on the
event loop, with that step's ``SchedulerStats`` (running / waiting requests, KV-cache usage,
prefix-cache lookups) and ``IterationStats`` (tokens generated in the step). This logger
forwards those numbers to a :class:`~services.worker.vllm.load_window.LoadWindow`, which the
engine's ``load()`` reads.

vLLM documents these two classes as *not* stable interfaces, so they are read here and nowhere
else, by attribute name with a default: a renamed field degrades the load report (and is logged
once), it never raises. That matters because an exception in a stat logger escapes into vLLM's
output handler, which then fails every request in flight.

Interface as of vllm(-cpu) 0.32.0: ``StatLoggerBase(vllm_config, engine_index=0)`` with
``record(scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0)`` and
``log_engine_initialized()``; a factory is any callable ``(vllm_config, engine_index)``.
One engine core (no data parallelism) is assumed: with several, their reports would
overwrite each other.

vLLM's own Prometheus metrics (``vllm:*``) are off unless ``--engine-metrics`` asks for them.
``AsyncLLM`` always adds a ``PrometheusStatLogger`` unless a stat logger of that class is
given, and that logger updates ~30 series per engine step on the event loop — measured at a
sixth of the worker's CPU per token (bench/README.md) — into prometheus_client's global
registry, which the worker's ``/metrics`` (its own registry) never showed. So by default
:class:`NoEngineMetrics` takes that slot and records nothing; with ``--engine-metrics`` vLLM
keeps its logger and :class:`VllmMetricsCollector` serves its families on the worker's
``/metrics`` beside Meridian's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerBase

from services.worker.vllm.load_window import LoadWindow

log = logging.getLogger(__name__)

StatLoggerFactory = Callable[[Any, int], StatLoggerBase]


class _WindowStatLogger(StatLoggerBase):  # type: ignore[misc]  # vllm is untyped here
    def __init__(self, vllm_config: Any, engine_index: int = 0, *, window: LoadWindow) -> None:
        self._window = window
        self._engine_index = engine_index
        self._missing: set[str] = set()

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            prefix = self._field(scheduler_stats, "prefix_cache_stats", None)
            self._window.observe_scheduler(
                running=self._field(scheduler_stats, "num_running_reqs", 0),
                waiting=self._field(scheduler_stats, "num_waiting_reqs", 0)
                + self._field(scheduler_stats, "num_skipped_waiting_reqs", 0),
                kv_cache_usage=self._field(scheduler_stats, "kv_cache_usage", 0.0),
                prefix_queries=self._field(prefix, "queries", 0) if prefix is not None else 0,
                prefix_hits=self._field(prefix, "hits", 0) if prefix is not None else 0,
            )
        if iteration_stats is not None:
            self._window.observe_tokens(self._field(iteration_stats, "num_generation_tokens", 0))

    def log_engine_initialized(self) -> None:
        """Nothing to say: the engine's state is reported through ``models()``."""

    def _field(self, stats: object, name: str, default: Any) -> Any:
        value = getattr(stats, name, None)
        if value is None:
            if name not in self._missing:
                self._missing.add(name)
                log.warning(
                    "vLLM %s has no field %r; reporting %r for it",
                    type(stats).__name__,
                    name,
                    default,
                )
            return default
        return value


def window_stat_logger(window: LoadWindow) -> StatLoggerFactory:
    """A factory for ``AsyncLLM(stat_loggers=[...])`` whose loggers feed ``window``."""

    def make(vllm_config: Any, engine_index: int = 0) -> StatLoggerBase:
        return _WindowStatLogger(vllm_config, engine_index, window=window)

    return make


class NoEngineMetrics(PrometheusStatLogger):  # type: ignore[misc]  # vllm is untyped here
    """Stands in vLLM's Prometheus slot so that vLLM adds none: records nothing, registers
    nothing (its base class's ``__init__``, which creates the series, is not called)."""

    def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
        self.engine_indexes = engine_indexes or [0]

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """Nothing: the window logger keeps what the load report needs."""

    def record_admission_rejection(self, reason: str) -> None:
        """Nothing (vLLM's admission counter is one of the series left out)."""

    def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
        """Nothing (the worker reports its model state itself)."""

    def log_engine_initialized(self) -> None:
        """Nothing to say: the engine's state is reported through ``models()``."""

    def log(self) -> None:
        """Nothing to log."""


def stat_loggers(window: LoadWindow, *, engine_metrics: bool) -> list[Any]:
    """``AsyncLLM(stat_loggers=...)``: the window's logger, and vLLM's Prometheus logger
    only when its metrics are asked for."""
    loggers: list[Any] = [window_stat_logger(window)]
    if not engine_metrics:
        loggers.append(NoEngineMetrics)
    return loggers


class VllmMetricsCollector(Collector):
    """vLLM's ``vllm:*`` families from prometheus_client's global registry, for the worker's
    own registry. Only those: the global registry's process and platform collectors would
    repeat families the worker's registry already has, which a scrape refuses."""

    def __init__(self, source: CollectorRegistry = REGISTRY) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            if family.name.startswith("vllm:"):
                yield family
