"""The load window: latest scheduler state, tokens/s and prefix-cache hit rate over time."""

from __future__ import annotations

import pytest

from services.common.clock import ManualClock
from services.worker.vllm.load_window import LoadSnapshot, LoadWindow


def test_a_fresh_window_reports_an_idle_engine() -> None:
    assert LoadWindow(window_s=10, clock=ManualClock()).snapshot() == LoadSnapshot()


def test_queue_state_is_the_latest_steps() -> None:
    window = LoadWindow(window_s=10, clock=ManualClock())
    window.observe_scheduler(running=5, waiting=2, kv_cache_usage=0.4)
    window.observe_scheduler(running=3, waiting=0, kv_cache_usage=0.25)

    snap = window.snapshot()

    assert (snap.running, snap.waiting, snap.kv_cache_usage) == (3, 0, 0.25)


@pytest.mark.parametrize(
    ("steps", "read_at", "rate"),
    [
        # (seconds after start, tokens) per step; read time; expected tokens/s
        ([(1, 100)], 2, 50.0),  # window not yet full: divide by the 2 s it has been open
        ([(1, 100), (5, 100)], 10, 20.0),  # full window: 200 tokens / 10 s
        ([(1, 100), (5, 100)], 12, 10.0),  # the first step left the window at t = 11
        ([(1, 100), (5, 100)], 30, 0.0),  # quiet engine: the rate decays to zero
    ],
)
def test_tokens_per_second_counts_the_recent_window(
    steps: list[tuple[float, int]], read_at: float, rate: float
) -> None:
    clock = ManualClock(start=0.0)
    window = LoadWindow(window_s=10, clock=clock)
    for at, tokens in steps:
        clock.advance(at - clock.monotonic())
        window.observe_tokens(tokens)
    clock.advance(read_at - clock.monotonic())

    assert window.snapshot().tokens_per_second == pytest.approx(rate)


def test_prefix_hit_rate_is_hits_over_queries_in_the_window() -> None:
    clock = ManualClock(start=0.0)
    window = LoadWindow(window_s=10, clock=clock)
    window.observe_scheduler(
        running=1, waiting=0, kv_cache_usage=0.1, prefix_queries=100, prefix_hits=0
    )
    clock.advance(6)
    window.observe_scheduler(
        running=1, waiting=0, kv_cache_usage=0.1, prefix_queries=300, prefix_hits=240
    )
    assert window.snapshot().prefix_cache_hit_rate == pytest.approx(240 / 400)

    clock.advance(5)  # the first lookup has left the window
    assert window.snapshot().prefix_cache_hit_rate == pytest.approx(240 / 300)

    clock.advance(10)
    assert window.snapshot().prefix_cache_hit_rate == 0.0


@pytest.mark.parametrize(
    ("running", "waiting", "usage", "expected"),
    [(-1, -3, -0.5, (0, 0, 0.0)), (2, 1, 1.5, (2, 1, 1.0))],
)
def test_out_of_range_reports_are_clamped(
    running: int, waiting: int, usage: float, expected: tuple[int, int, float]
) -> None:
    window = LoadWindow(window_s=10, clock=ManualClock())
    window.observe_scheduler(running=running, waiting=waiting, kv_cache_usage=usage)

    snap = window.snapshot()

    assert (snap.running, snap.waiting, snap.kv_cache_usage) == expected


def test_the_window_must_have_a_length() -> None:
    with pytest.raises(ValueError, match="window_s"):
        LoadWindow(window_s=0, clock=ManualClock())
