"""The admission policy around the backends: local checks before Redis, the breaker, the
fail-open / fail-closed modes and the life of a lease — with a real Redis, and a Redis client
aimed at a port nobody listens on for "Redis is down"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.typing import ZSetRangeResponse

from services.common.clock import ManualClock
from services.common.errors import Unavailable
from services.common.net import free_port
from services.edge.breaker import Breaker
from services.edge.counters import EdgeCounters
from services.edge.ratelimit.limiter import (
    FailureMode,
    Lease,
    RateLimitConfig,
    RateLimiter,
    RateLimitExceeded,
)
from services.edge.ratelimit.redis_backend import Charge, RedisBackend, scope_keys
from services.edge.ratelimit.types import Ask, Scope
from services.edge.ratelimit.window import LocalBackend
from services.edge.tenancy.tenants import Limits
from tests.support.redis_proc import RedisProcess
from tests.support.wait import eventually


@pytest.fixture
async def live(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def dead() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(
        f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5, socket_timeout=0.5
    )
    yield client
    await client.aclose()


def make(
    client: aioredis.Redis | None,
    clock: ManualClock,
    counters: EdgeCounters,
    **config: object,
) -> RateLimiter:
    cfg = RateLimitConfig(**config)  # type: ignore[arg-type]
    return RateLimiter(
        redis=None
        if client is None
        else RedisBackend(redis=client, window_ms=cfg.window_ms, lease_ms=cfg.lease_ms),
        local=LocalBackend(window_ms=cfg.window_ms, lease_ms=cfg.lease_ms),
        breaker=Breaker(clock=clock, counters=counters, open_for_s=1.0),
        counters=counters,
        clock=clock,
        config=cfg,
    )


_n = 0


def ask(tokens: int = 1, **limits: int) -> Ask:
    global _n
    _n += 1
    return Ask(f"q{_n}", tokens, (Scope("tenant", "acme", "{acme}:t", Limits(**limits)),))


def scored(rows: ZSetRangeResponse) -> list[tuple[bytes, float]]:
    """``zrange(..., withscores=True)`` as (member, score) pairs: the client has no
    ``decode_responses``, so members are bytes (its types allow str, and rows without scores)."""
    pairs: list[tuple[bytes, float]] = []
    for row in rows:
        assert isinstance(row, tuple), row
        member, score = row
        assert isinstance(member, bytes), row
        assert isinstance(score, float), row
        pairs.append((member, score))
    return pairs


async def evalsha_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_unlimited_requests_touch_no_backend(dead: aioredis.Redis) -> None:
    counters = EdgeCounters()
    limiter = make(dead, ManualClock(), counters)
    lease = await limiter.admit(ask())
    assert lease.backend is None
    assert (counters.admitted, counters.limiter_redis_errors) == (1, 0)


async def test_admitted_requests_carry_openai_rate_limit_headers(live: aioredis.Redis) -> None:
    limiter = make(live, ManualClock(), EdgeCounters())
    lease = await limiter.admit(ask(30, rpm=10, tpm=100))
    assert lease.headers == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "1m0s",
        "x-ratelimit-limit-tokens": "100",
        "x-ratelimit-remaining-tokens": "70",
        "x-ratelimit-reset-tokens": "1m0s",
    }


async def test_an_rpm_refusal_is_remembered_locally_until_a_slot_frees(
    live: aioredis.Redis,
) -> None:
    clock, counters = ManualClock(), EdgeCounters()
    limiter = make(live, clock, counters)
    for _ in range(2):
        await limiter.admit(ask(rpm=2))
    with pytest.raises(RateLimitExceeded) as first:
        await limiter.admit(ask(rpm=2))
    assert first.value.retry_after_s == 60.0
    calls = await evalsha_calls(live)
    clock.advance(30)
    with pytest.raises(RateLimitExceeded) as second:
        await limiter.admit(ask(rpm=2))
    assert await evalsha_calls(live) == calls  # Redis was spared
    assert second.value.retry_after_s == 30.0
    assert second.value.headers["x-ratelimit-remaining-requests"] == "0"
    assert (counters.rate_limited_requests, counters.rate_limited_locally) == (2, 1)
    clock.advance(30)
    await limiter.admit(ask(rpm=2))


async def test_raising_the_rpm_of_a_throttled_scope_takes_effect_at_once(
    live: aioredis.Redis,
) -> None:
    clock, counters = ManualClock(), EdgeCounters()
    limiter = make(live, clock, counters)
    for _ in range(2):
        await limiter.admit(ask(rpm=2))
    with pytest.raises(RateLimitExceeded):
        await limiter.admit(ask(rpm=2))  # remembered until a slot frees
    clock.advance(1)
    lease = await limiter.admit(ask(rpm=100))  # not the memory of rpm=2: Redis
    assert lease.headers["x-ratelimit-remaining-requests"] == "97"
    assert counters.rate_limited_locally == 0


async def test_lowering_the_rpm_of_a_throttled_scope_asks_redis_again(
    live: aioredis.Redis,
) -> None:
    clock, counters = ManualClock(), EdgeCounters()
    limiter = make(live, clock, counters)
    for _ in range(3):
        await limiter.admit(ask(rpm=3))
    with pytest.raises(RateLimitExceeded):
        await limiter.admit(ask(rpm=3))
    calls = await evalsha_calls(live)
    with pytest.raises(RateLimitExceeded) as refused:
        await limiter.admit(ask(rpm=2))
    assert await evalsha_calls(live) == calls + 1
    assert "Limit 2, Used 3, Requested 1" in refused.value.message


async def test_a_remembered_rpm_refusal_reports_the_requests_really_used(
    live: aioredis.Redis,
) -> None:
    clock, counters = ManualClock(), EdgeCounters()
    limiter = make(live, clock, counters)
    for _ in range(3):
        await limiter.admit(ask(rpm=3))
    clock.advance(10)
    # The limit is lowered to 2 while 3 are in the window: Redis refuses with Used 3, and so
    # must the refusal remembered from it (not "Used 2", the limit).
    refusals = []
    for _ in range(2):
        with pytest.raises(RateLimitExceeded) as refused:
            await limiter.admit(ask(rpm=2))
        refusals.append(refused.value)
    assert counters.rate_limited_locally == 1
    for err in refusals:
        assert "on tenant acme: Limit 2, Used 3, Requested 1" in err.message
        assert err.headers["x-ratelimit-remaining-requests"] == "0"
    assert refusals[1].retry_after_s == 50.0


async def test_a_request_larger_than_tpm_is_refused_without_redis(dead: aioredis.Redis) -> None:
    counters = EdgeCounters()
    limiter = make(dead, ManualClock(), counters)
    with pytest.raises(RateLimitExceeded) as refused:
        await limiter.admit(ask(500, tpm=100))
    assert "Request too large" in refused.value.message
    assert refused.value.retry_after_s is None
    assert refused.value.headers["x-should-retry"] == "false"
    assert (counters.rate_limited_too_large, counters.limiter_redis_errors) == (1, 0)


async def test_only_a_request_larger_than_tpm_is_marked_not_to_be_retried(
    live: aioredis.Redis,
) -> None:
    limiter = make(live, ManualClock(), EdgeCounters())
    scope = (Scope("tenant", "no-retry", "{no-retry}:t", Limits(tpm=100)),)
    with pytest.raises(RateLimitExceeded) as too_large:
        await limiter.admit(Ask("big", 500, scope))
    assert too_large.value.headers["x-should-retry"] == "false"
    await limiter.admit(Ask("first", 60, scope))
    with pytest.raises(RateLimitExceeded) as full:  # waiting helps this one: retry it
        await limiter.admit(Ask("second", 60, scope))
    assert "Rate limit reached for tokens per minute" in full.value.message
    assert "x-should-retry" not in full.value.headers


async def test_fail_open_decides_on_local_windows_scaled_to_the_replica_share(
    dead: aioredis.Redis,
) -> None:
    counters = EdgeCounters()
    limiter = make(dead, ManualClock(), counters, local_share=0.5)
    first = await limiter.admit(ask(rpm=4))
    await limiter.admit(ask(rpm=4))
    with pytest.raises(RateLimitExceeded):
        await limiter.admit(ask(rpm=4))
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert counters.limiter_fail_open == 3
    assert counters.limiter_redis_errors == 1  # then the breaker kept Redis out of the way


async def test_fail_closed_refuses_with_503(dead: aioredis.Redis) -> None:
    counters = EdgeCounters()
    limiter = make(dead, ManualClock(), counters, failure_mode=FailureMode.CLOSED)
    with pytest.raises(Unavailable) as refused:
        await limiter.admit(ask(rpm=4))
    assert refused.value.http_status == 503
    assert refused.value.retry_after_s == 1.0
    assert counters.limiter_fail_closed == 1


async def test_the_breaker_retries_redis_once_its_open_period_is_over(
    dead: aioredis.Redis,
) -> None:
    clock, counters = ManualClock(), EdgeCounters()
    limiter = make(dead, clock, counters)
    await limiter.admit(ask(rpm=100))
    await limiter.admit(ask(rpm=100))
    assert counters.limiter_redis_errors == 1
    clock.advance(1.0)
    await limiter.admit(ask(rpm=100))
    assert counters.limiter_redis_errors == 2
    assert counters.redis_breaker_opened == 1  # still open: opened once


async def test_settling_frees_the_stream_slot_in_the_background(live: aioredis.Redis) -> None:
    limiter = make(live, ManualClock(), EdgeCounters())
    lease = await limiter.admit(ask(50, tpm=100, max_streams=1))
    assert limiter.live_leases == 1
    limiter.settle(lease, 7)
    limiter.settle(lease, 7)  # idempotent
    await limiter.close()
    assert limiter.live_leases == 0
    nxt = await limiter.admit(ask(50, tpm=100, max_streams=1))
    assert nxt.headers["x-ratelimit-remaining-tokens"] == "43"  # 100 - 7 - 50


async def test_a_settle_that_cannot_reach_redis_at_shutdown_is_counted_as_failed(
    dead: aioredis.Redis,
) -> None:
    counters = EdgeCounters()
    limiter = make(dead, ManualClock(), counters)
    backend = RedisBackend(redis=dead, window_ms=60_000, lease_ms=30_000)
    limiter.settle(Lease(ask(max_streams=1), backend), 1)
    await limiter.close()
    assert counters.settle_failures == 1


async def test_a_settle_that_fails_is_sent_again_once_redis_answers(
    tmp_path: Path,
) -> None:
    """The reservation is corrected and the stream slot freed after an outage, not left
    charged until the window forgets it."""
    server = RedisProcess(tmp_path / "redis")
    server.start()
    client = aioredis.Redis.from_url(server.url, socket_connect_timeout=0.3, socket_timeout=0.3)
    clock = ManualClock()
    counters = EdgeCounters()
    limiter = make(client, clock, counters)
    try:
        lease = await limiter.admit(ask(100, tpm=1000, max_streams=1))
        server.stop()
        limiter.settle(lease, 7)
        await eventually(lambda: counters.settle_retries >= 2, timeout_s=10)
        server.start()  # same port, empty: the admission is gone, so admit it again first
        (scope,) = lease.ask.scopes
        window, tokens, streams = scope_keys(scope)
        await client.zadd(window, {lease.ask.request_id: int(clock.time() * 1000)})
        await client.hset(tokens, mapping={lease.ask.request_id: 100, "#sum": 100})
        await client.zadd(streams, {lease.ask.request_id: int(clock.time() * 1000) + 30_000})
        clock.advance(2.0)  # the breaker lets Redis be tried again
        await eventually(lambda: limiter._flusher is None, timeout_s=10)
        assert await client.hget(tokens, "#sum") == b"7"
        assert await client.zcard(streams) == 0
        assert counters.settle_failures == 0
    finally:
        await limiter.close()
        await client.aclose()
        server.stop()


async def test_renewal_extends_the_leases_of_live_requests(live: aioredis.Redis) -> None:
    clock = ManualClock()
    limiter = make(live, clock, EdgeCounters())
    lease = await limiter.admit(ask(max_streams=2))
    clock.advance(10)
    await limiter.renew_once()
    (scope,) = lease.ask.scopes
    [(member, expiry)] = scored(await live.zrange(scope_keys(scope)[2], 0, -1, withscores=True))
    assert member == lease.ask.request_id.encode()
    assert expiry == int(clock.time() * 1000) + 30_000


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"window_s": 0.5}, "window_s"),
        ({"renew_every_s": 20.0, "lease_ttl_s": 30.0}, "renew_every_s"),
        ({"local_share": 0.0}, "local_share"),
        ({"local_share": 1.5}, "local_share"),
        ({"default_completion_tokens": 0}, "default_completion_tokens"),
    ],
)
def test_bad_limiter_config_is_refused(config: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RateLimitConfig(**config)  # type: ignore[arg-type]


async def test_a_burst_of_settles_is_group_committed_and_all_applied(
    live: aioredis.Redis,
) -> None:
    limiter = make(live, ManualClock(), EdgeCounters())
    leases = [await limiter.admit(ask(100, tpm=10_000, max_streams=50)) for _ in range(50)]
    for lease in leases:
        limiter.settle(lease, 10)  # 49 of them queue behind the first round trip
    await limiter.close()
    (scope,) = leases[0].ask.scopes
    _, tokens, streams = scope_keys(scope)
    assert await live.zcard(streams) == 0
    total = await live.hget(tokens, "#sum")
    assert total is not None
    assert int(total) == 500


async def test_settles_that_cannot_reach_redis_by_shutdown_are_each_counted(
    dead: aioredis.Redis,
) -> None:
    counters = EdgeCounters()
    limiter = make(dead, ManualClock(), counters, failure_mode=FailureMode.OPEN)
    backend = limiter._redis
    assert backend is not None
    for _ in range(3):
        limiter.settle(Lease(ask(max_streams=1), backend), 1)
    await limiter.close()
    assert counters.settle_failures == 3


class _Outage:
    """A real Redis the test stops and starts again (same port, empty after a restart), with
    a limiter on the edge's short timeouts in front of it."""

    def __init__(self, tmp_path: Path) -> None:
        self.server = RedisProcess(tmp_path / "redis")
        self.server.start()
        self.client = aioredis.Redis.from_url(
            self.server.url, socket_connect_timeout=0.3, socket_timeout=0.3
        )
        self.clock = ManualClock()
        self.counters = EdgeCounters()
        self.limiter = make(self.client, self.clock, self.counters)

    async def back(self) -> None:
        """Redis answers again, and the breaker's open period is over."""
        self.server.start()
        self.clock.advance(2.0)

    async def close(self) -> None:
        await self.limiter.close()
        await self.client.aclose()
        self.server.stop()


@pytest.fixture
async def outage(tmp_path: Path) -> AsyncIterator[_Outage]:
    world = _Outage(tmp_path)
    yield world
    await world.close()


async def test_requests_admitted_during_an_outage_count_against_the_limit_once_redis_is_back(
    outage: _Outage,
) -> None:
    """Without the charge-back, Redis would admit 5 more here: the outage's 3 requests would
    vanish and the tenant get its whole rpm on top of them."""
    limiter, clock = outage.limiter, outage.clock
    outage.server.stop()
    leases = []
    for _ in range(3):
        leases.append(await limiter.admit(ask(100, rpm=5, tpm=10_000)))
        clock.advance(0.1)
    assert all(x.fail_open_at_ms is not None for x in leases)
    for lease in leases:
        limiter.settle(lease, 40)
    await eventually(lambda: outage.counters.settle_retries >= 1, timeout_s=10)
    await outage.back()
    await eventually(lambda: limiter._flusher is None, timeout_s=10)
    assert outage.counters.limiter_charged_back == 3

    (scope,) = leases[0].ask.scopes
    window, tokens, _ = scope_keys(scope)
    admitted_at = [
        int(score)
        for _, score in scored(await outage.client.zrange(window, 0, -1, withscores=True))
    ]
    assert admitted_at == [x.fail_open_at_ms for x in leases]  # each at its own admission
    assert await outage.client.hget(tokens, "#sum") == b"120"  # the tokens they used
    await limiter.admit(ask(100, rpm=5, tpm=10_000))
    await limiter.admit(ask(100, rpm=5, tpm=10_000))
    with pytest.raises(RateLimitExceeded) as refused:
        await limiter.admit(ask(100, rpm=5, tpm=10_000))
    assert "Limit 5, Used 5" in str(refused.value)


async def test_charging_the_same_request_twice_writes_the_same_state(live: aioredis.Redis) -> None:
    """A resend after a lost reply (or a failover) must not charge the request twice."""
    backend = RedisBackend(redis=live, window_ms=60_000, lease_ms=30_000)
    charged = ask(100, rpm=5, tpm=1000, max_streams=2)
    charge = Charge(charged, 30, admitted_ms=5_000, live=False)
    for _ in range(2):
        await backend.charge_many([charge], now_ms=6_000)
    (scope,) = charged.scopes
    window, tokens, streams = scope_keys(scope)
    assert scored(await live.zrange(window, 0, -1, withscores=True)) == [
        (charged.request_id.encode(), 5_000.0)
    ]
    assert await live.hget(tokens, "#sum") == b"30"
    assert await live.zcard(streams) == 0
    await backend.charge_many([Charge(charged, 45, admitted_ms=5_000, live=False)], now_ms=7_000)
    assert await live.hget(tokens, "#sum") == b"45"  # set, not added


async def test_a_stream_admitted_during_an_outage_holds_its_slot_in_redis_once_it_is_back(
    outage: _Outage,
) -> None:
    """Another replica must see the stream this one opened while Redis was out."""
    limiter, clock = outage.limiter, outage.clock
    other = make(outage.client, clock, EdgeCounters())
    try:
        outage.server.stop()
        stream = await limiter.admit(ask(100, tpm=10_000, max_streams=1))
        assert stream.backend is not limiter._redis
        await outage.back()
        await limiter.renew_once()  # the next renewal moves it to Redis
        assert stream.backend is limiter._redis
        assert outage.counters.limiter_leases_adopted == 1
        with pytest.raises(RateLimitExceeded) as refused:
            await other.admit(ask(100, tpm=10_000, max_streams=1))
        assert "concurrent" in str(refused.value).lower() or "stream" in str(refused.value).lower()

        limiter.settle(stream, 7)  # it ends: settled in Redis like any other
        await eventually(lambda: limiter._flusher is None, timeout_s=10)
        (scope,) = stream.ask.scopes
        _, tokens, streams = scope_keys(scope)
        assert await outage.client.zcard(streams) == 0
        assert await outage.client.hget(tokens, "#sum") == b"7"
        await other.admit(ask(100, tpm=10_000, max_streams=1))
    finally:
        await other.close()


async def test_a_redis_admission_after_an_outage_moves_live_streams_to_redis_without_waiting(
    outage: _Outage,
) -> None:
    limiter = outage.limiter
    outage.server.stop()
    stream = await limiter.admit(ask(10, max_streams=5))
    await outage.back()
    await limiter.admit(ask(10, max_streams=5))  # Redis decides this one
    await eventually(lambda: stream.backend is limiter._redis, timeout_s=10)


async def test_an_outage_request_whose_window_has_passed_is_not_charged(outage: _Outage) -> None:
    limiter, clock = outage.limiter, outage.clock
    outage.server.stop()
    lease = await limiter.admit(ask(100, rpm=5))
    limiter.settle(lease, 10)
    clock.advance(61.0)  # Redis returns after the request has left its window
    await outage.back()
    await eventually(lambda: limiter._flusher is None, timeout_s=10)
    (scope,) = lease.ask.scopes
    window, _, _ = scope_keys(scope)
    assert await outage.client.zcard(window) == 0
    assert outage.counters.limiter_charges_dropped == 1
    assert outage.counters.limiter_charged_back == 0
    assert outage.counters.settle_failures == 0


async def test_a_stream_that_ends_while_it_moves_to_redis_keeps_its_used_tokens_and_frees_its_slot(
    outage: _Outage,
) -> None:
    limiter = outage.limiter
    outage.server.stop()
    stream = await limiter.admit(ask(100, tpm=10_000, max_streams=1))
    await outage.back()
    backend = limiter._redis
    assert backend is not None
    charge_many = backend.charge_many

    async def ending_meanwhile(items: list[Charge], now_ms: int) -> None:
        if any(c.live for c in items):
            limiter.settle(stream, 7)  # the stream ends while its move is on the wire
        await charge_many(items, now_ms)

    backend.charge_many = ending_meanwhile  # type: ignore[method-assign, assignment]
    await limiter.renew_once()
    await eventually(lambda: limiter._flusher is None, timeout_s=10)
    (scope,) = stream.ask.scopes
    _, tokens, streams = scope_keys(scope)
    assert await outage.client.hget(tokens, stream.ask.request_id) == b"7"
    assert await outage.client.zcard(streams) == 0
