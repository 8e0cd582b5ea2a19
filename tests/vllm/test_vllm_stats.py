"""The stat logger that turns vLLM's per-step stats into the load window's numbers."""

from __future__ import annotations

import logging

import pytest
from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats

from services.common.clock import ManualClock
from services.worker.vllm.load_window import LoadSnapshot, LoadWindow
from services.worker.vllm.stats import window_stat_logger


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
