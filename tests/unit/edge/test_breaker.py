from __future__ import annotations

import pytest
import redis.exceptions

from services.common.clock import ManualClock
from services.common.loopwatch import LoopWatch
from services.edge.breaker import Breaker, BreakerOpen
from services.edge.counters import EdgeCounters


def is_open(breaker: Breaker) -> bool:
    """``breaker.is_open``, read afresh: mypy keeps a property narrowed by an ``assert`` across
    the method calls that change it, and would call the next, opposite assert unreachable."""
    return breaker.is_open


def test_a_failure_opens_the_breaker_for_its_period_then_lets_calls_try_again() -> None:
    clock, counters = ManualClock(), EdgeCounters()
    breaker = Breaker(clock=clock, counters=counters, open_for_s=2.0)
    assert breaker.allow()
    assert not is_open(breaker)
    breaker.failure()
    assert not breaker.allow()
    assert is_open(breaker)
    clock.advance(1.9)
    assert not breaker.allow()
    clock.advance(0.1)
    assert breaker.allow()  # half-open: try again
    breaker.failure()  # still down: another period
    assert not breaker.allow()
    clock.advance(2.0)
    breaker.success()
    assert breaker.allow()
    assert not is_open(breaker)
    assert counters.redis_breaker_opened == 1


def test_the_open_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="open_for_s"):
        Breaker(clock=ManualClock(), counters=EdgeCounters(), open_for_s=0)


class Calls:
    """A Redis call that takes 1 s on ``watch``'s clock, ``stall_s`` of it with the event loop
    stalled, and fails with the given errors in turn, then answers."""

    def __init__(self, watch: Watched, *errors: Exception) -> None:
        self.watch = watch
        self.errors = list(errors)
        self.made = 0

    async def __call__(self) -> str:
        self.made += 1
        self.watch.now += 1.0
        self.watch.record(self.watch.now, self.watch.stall_s)
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


class Watched(LoopWatch):
    def __init__(self, stall_s: float) -> None:
        super().__init__(clock=lambda: self.now)
        self.now = 0.0
        self.stall_s = stall_s


async def test_a_timeout_the_edges_own_stall_explains_is_retried_without_opening() -> None:
    counters = EdgeCounters()
    watch = Watched(0.8)
    breaker = Breaker(clock=ManualClock(), counters=counters, watch=watch)
    call = Calls(watch, redis.exceptions.TimeoutError("Timeout reading from socket"))
    assert await breaker.call(call) == "ok"
    assert call.made == 2
    assert not is_open(breaker)
    assert counters.redis_timeouts_in_stalls == 1


async def test_a_second_timeout_in_a_stall_opens_the_breaker() -> None:
    counters = EdgeCounters()
    watch = Watched(0.8)
    breaker = Breaker(clock=ManualClock(), counters=counters, watch=watch)
    call = Calls(watch, redis.exceptions.TimeoutError(), redis.exceptions.TimeoutError())
    with pytest.raises(redis.exceptions.TimeoutError):
        await breaker.call(call)
    assert call.made == 2
    assert is_open(breaker)


@pytest.mark.parametrize(
    ("stall_s", "error"),
    [
        (0.1, redis.exceptions.TimeoutError()),  # the loop kept up: Redis was slow
        (0.8, redis.exceptions.ConnectionError("refused")),  # not a timeout: Redis is down
    ],
)
async def test_a_failure_the_edge_does_not_explain_opens_the_breaker_at_once(
    stall_s: float, error: Exception
) -> None:
    counters = EdgeCounters()
    watch = Watched(stall_s)
    breaker = Breaker(clock=ManualClock(), counters=counters, watch=watch)
    call = Calls(watch, error)
    with pytest.raises(type(error)):
        await breaker.call(call)
    assert call.made == 1
    assert is_open(breaker)
    assert counters.redis_timeouts_in_stalls == 0
    with pytest.raises(BreakerOpen):  # and then Redis is not called at all
        await breaker.call(call)
    assert call.made == 1
