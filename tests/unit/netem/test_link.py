"""The link schedule: when each chunk may leave, as plain numbers (no sockets, no loop)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.netem.config import LinkProfile
from services.netem.link import LinkSchedule


def schedule(link: LinkProfile, key: str = "k") -> LinkSchedule:
    return LinkSchedule(lambda: link, rng_key=key)


@pytest.mark.parametrize("delay_ms", [0.0, 0.5, 40.0, 250.0])
def test_clean_link_releases_each_chunk_after_exactly_the_delay(delay_ms: float) -> None:
    s = schedule(LinkProfile(delay_ms=delay_ms))
    for now in (10.0, 10.001, 11.5):
        assert s.release_at(now) == pytest.approx(now + delay_ms / 1000)


@given(
    gaps=st.lists(st.floats(min_value=0, max_value=0.05), min_size=1, max_size=200),
    delay_ms=st.floats(min_value=0, max_value=100),
    jitter_ms=st.floats(min_value=0, max_value=100),
    loss=st.floats(min_value=0, max_value=1),
    key=st.text(max_size=8),
)
def test_release_times_never_go_backwards_so_bytes_are_never_reordered(
    gaps: list[float], delay_ms: float, jitter_ms: float, loss: float, key: str
) -> None:
    s = schedule(LinkProfile(delay_ms=delay_ms, jitter_ms=jitter_ms, loss=loss, rto_ms=50), key)
    now, last = 0.0, float("-inf")
    for gap in gaps:
        now += gap
        release = s.release_at(now)
        assert release >= last
        assert release >= now  # nothing leaves before it arrived
        last = release


def test_jitter_stays_within_its_bounds_when_chunks_are_far_apart() -> None:
    link = LinkProfile(delay_ms=40, jitter_ms=10)
    s = schedule(link)
    delays = []
    for i in range(2000):
        now = i * 1.0  # far apart: the previous release never holds a chunk back
        delays.append(s.release_at(now) - now)
    assert min(delays) >= 0.030 - 1e-9
    assert max(delays) <= 0.050 + 1e-9
    assert max(delays) - min(delays) > 0.015  # it does jitter


def test_jitter_larger_than_the_delay_is_clamped_at_zero() -> None:
    s = schedule(LinkProfile(delay_ms=1, jitter_ms=20))
    delays = [s.release_at(i * 1.0) - i * 1.0 for i in range(500)]
    assert min(delays) == 0.0
    assert max(delays) <= 0.021 + 1e-9


def test_a_chunk_that_drew_a_short_delay_waits_behind_a_longer_one() -> None:
    link = LinkProfile(delay_ms=0, loss=1.0, rto_ms=200)
    s = LinkSchedule(lambda: link, rng_key="hol")
    stalled = s.release_at(0.0)
    assert stalled == pytest.approx(0.2)
    link = LinkProfile(delay_ms=0)  # the link is clean again for the next chunk...
    assert s.release_at(0.001) == stalled  # ...which still leaves no earlier (head of line)
    assert s.release_at(0.5) == pytest.approx(0.5)


def test_same_key_gives_the_same_schedule_and_another_key_a_different_one() -> None:
    link = LinkProfile(delay_ms=20, jitter_ms=5, loss=0.1, rto_ms=100)
    times = [i * 0.5 for i in range(300)]
    a = [schedule(link, "7/kr/1/up").release_at(t) for t in times]
    b = [schedule(link, "7/kr/1/up").release_at(t) for t in times]
    c = [schedule(link, "7/kr/1/down").release_at(t) for t in times]
    assert a == b
    assert a != c


@pytest.mark.parametrize(
    ("loss", "low", "high"),
    [(0.0, 0, 0), (1.0, 10_000, 10_000), (0.1, 850, 1150), (0.5, 4800, 5200)],
)
def test_loss_stalls_about_that_fraction_of_chunks(loss: float, low: int, high: int) -> None:
    stalls = 0

    def count() -> None:
        nonlocal stalls
        stalls += 1

    link = LinkProfile(delay_ms=10, loss=loss, rto_ms=200)
    s = LinkSchedule(lambda: link, rng_key="loss", on_stall=count)
    stalled = sum(1 for i in range(10_000) if s.release_at(i * 1.0) - i * 1.0 > 0.1)
    assert stalls == stalled
    assert low <= stalls <= high


def test_a_profile_change_applies_to_chunks_read_after_it() -> None:
    link = LinkProfile(delay_ms=10)
    s = LinkSchedule(lambda: link, rng_key="live")
    assert s.release_at(1.0) == pytest.approx(1.010)
    link = dataclasses.replace(link, delay_ms=100)
    assert s.release_at(2.0) == pytest.approx(2.100)
