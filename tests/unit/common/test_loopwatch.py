"""The loop watch: a stall of the event loop is measured, ordinary scheduling is not."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.common.loopwatch import LoopWatch


async def test_a_blocked_loop_is_measured_as_stalled_time() -> None:
    watch = LoopWatch(interval_s=0.01)
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    await asyncio.sleep(0.05)
    mark = watch.mark()
    time.sleep(0.3)  # noqa: ASYNC251  # the stall itself: a long GC pass, a starved CPU
    assert watch.stalled_since(mark) >= 0.25  # counted while still going on ...
    await asyncio.sleep(0.05)
    assert 0.25 <= watch.stalled_since(mark) <= 0.4  # ... and once the late tick has run
    assert watch.worst_s >= 0.25
    stop.set()
    await task


async def test_a_loop_that_keeps_up_shows_no_stall() -> None:
    watch = LoopWatch(interval_s=0.01)
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(0.02)
    mark = watch.mark()
    await asyncio.sleep(0.2)
    assert watch.stalled_since(mark) < 0.05
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_only_the_part_of_a_stall_after_the_mark_counts() -> None:
    now = [100.0]
    watch = LoopWatch(interval_s=0.02, clock=lambda: now[0])
    watch.record(99.0, 0.5)  # before the mark: not counted
    mark = watch.mark()
    now[0] = 100.3
    watch.record(100.3, 0.4)  # stalled from 99.9: 0.3 s of it after the mark
    assert watch.stalled_since(mark) == pytest.approx(0.3)
    watch.record(100.31, 0.001)  # jitter, not a stall
    assert watch.stalled_since(mark) == pytest.approx(0.3)
    assert watch.total_s == pytest.approx(0.9)


@pytest.mark.parametrize(("interval", "horizon"), [(0, 60), (2, 60), (0.5, 0.1)])
def test_the_interval_and_horizon_are_checked(interval: float, horizon: float) -> None:
    with pytest.raises(ValueError, match=r"interval_s|horizon_s"):
        LoopWatch(interval_s=interval, horizon_s=horizon)
