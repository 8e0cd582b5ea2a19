"""The stat logger that turns vLLM's per-step stats into the load window's numbers."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats

from services.common.clock import ManualClock
from services.worker.vllm.load_window import LoadSnapshot, LoadWindow
from services.worker.vllm.stats import (
    NoEngineMetrics,
    VllmMetricsCollector,
    stat_loggers,
    window_stat_logger,
)


def make_window() -> tuple[LoadWindow, ManualClock]:
    clock = ManualClock(start=0.0)
    return LoadWindow(window_s=10, clock=clock), clock


def test_a_step_of_vllm_stats_becomes_the_load_window_state() -> None:
    window, clock = make_window()
    logger = window_stat_logger(window)(None, 0)
    scheduler = SchedulerStats(
        num_running_reqs=6,
        num_waiting_reqs=2,
        num_skipped_waiting_reqs=1,
        kv_cache_usage=0.3,
        prefix_cache_stats=PrefixCacheStats(requests=2, queries=256, hits=128),
    )
    iteration = IterationStats()
    iteration.num_generation_tokens = 6

    clock.advance(2)
    logger.record(scheduler, iteration)

    assert window.snapshot() == LoadSnapshot(
        running=6, waiting=3, kv_cache_usage=0.3, tokens_per_second=3.0, prefix_cache_hit_rate=0.5
    )


def test_steps_without_stats_change_nothing() -> None:
    window, clock = make_window()
    logger = window_stat_logger(window)(None, 0)
    clock.advance(1)

    logger.record(None, None)

    assert window.snapshot() == LoadSnapshot()


class FutureSchedulerStats:
    """vLLM's stats after a rename: the fields this logger reads are gone."""

    num_running = 3


def test_a_renamed_vllm_field_degrades_the_report_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    window, _ = make_window()
    logger = window_stat_logger(window)(None, 0)

    with caplog.at_level(logging.WARNING, logger="services.worker.vllm.stats"):
        logger.record(FutureSchedulerStats(), object())
        logger.record(FutureSchedulerStats(), object())

    assert window.snapshot() == LoadSnapshot()
    warned = [r.getMessage() for r in caplog.records]
    assert sum("num_running_reqs" in message for message in warned) == 1
    assert sum("num_generation_tokens" in message for message in warned) == 1


def test_vllms_prometheus_slot_is_taken_by_a_logger_that_records_nothing_unless_asked() -> None:
    window, _ = make_window()
    default = stat_loggers(window, engine_metrics=False)
    asked = stat_loggers(window, engine_metrics=True)

    # vLLM adds its own PrometheusStatLogger unless one of that class is given.
    assert NoEngineMetrics in default
    assert issubclass(NoEngineMetrics, PrometheusStatLogger)
    assert NoEngineMetrics not in asked
    assert len(asked) == 1
    logger = NoEngineMetrics(None, [0])
    scheduler = SchedulerStats(num_running_reqs=3, kv_cache_usage=0.5)
    logger.record(scheduler, IterationStats())
    logger.record_sleep_state(1, 1)
    logger.log_engine_initialized()
    assert not hasattr(logger, "gauge_scheduler_running")  # no series were created


def test_the_metrics_collector_passes_only_vllms_families() -> None:
    source = CollectorRegistry()
    Gauge("vllm:num_requests_running", "running", ["model_name"], registry=source).labels("m").set(
        2
    )
    Counter("process_cpu_seconds", "cpu", registry=source).inc()
    worker_registry = CollectorRegistry()
    Counter("process_cpu_seconds", "the worker's own", registry=worker_registry).inc()

    worker_registry.register(VllmMetricsCollector(source))
    text = generate_latest(worker_registry).decode()

    assert 'vllm:num_requests_running{model_name="m"} 2.0' in text
    assert text.count("# TYPE process_cpu_seconds_total counter") == 1
