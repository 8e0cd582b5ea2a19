from __future__ import annotations

import pytest

from services.common.clock import ManualClock
from services.edge.breaker import Breaker
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
