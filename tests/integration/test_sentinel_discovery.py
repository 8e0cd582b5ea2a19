"""The edge's Sentinel client follows the newest configuration, against real sentinels.

Just after a failover the sentinels disagree for a moment (they learn of it from each other),
and after an *ordered* failover the old primary still takes writes until it is demoted; every
write it takes then is lost. Two lone sentinels, each sure of a different primary at a
different configuration epoch, stand for that moment: the client must not go back to the
older answer once it has seen the newer one, and a connection still bound to the old
primary must not be used again once the client knows the new one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from services.edge.redisconn import (
    BlockingSentinelPool,
    EpochSentinel,
    close_client,
    connect,
    parse_redis_url,
)
from tests.support.redis_topologies import MASTER_NAME, LoneSentinel

pytestmark = pytest.mark.slow


@pytest.fixture
def stale_and_fresh(tmp_path: Path) -> Iterator[tuple[LoneSentinel, LoneSentinel]]:
    """A sentinel still at epoch 1 (the old primary) and one at epoch 2 (the new one)."""
    stale, fresh = LoneSentinel(tmp_path / "stale", epoch=1), LoneSentinel(tmp_path / "fresh", 2)
    stale.start()
    try:
        fresh.start()
        yield stale, fresh
    finally:
        fresh.stop()
        stale.stop()


def sentinel_client(*sentinels: LoneSentinel) -> aioredis.Redis:
    hosts = ",".join(f"127.0.0.1:{s.sentinel_port}" for s in sentinels)
    client = connect(parse_redis_url(f"redis+sentinel://{hosts}/{MASTER_NAME}/0"))
    assert isinstance(client, aioredis.Redis)
    return client


def manager(client: aioredis.Redis) -> EpochSentinel:
    pool = client.connection_pool
    assert isinstance(pool, BlockingSentinelPool)
    sentinel = pool.sentinel_manager
    assert isinstance(sentinel, EpochSentinel)
    return sentinel


async def test_discovery_never_goes_back_to_an_older_configuration(
    stale_and_fresh: tuple[LoneSentinel, LoneSentinel],
) -> None:
    stale, fresh = stale_and_fresh
    client = sentinel_client(fresh, stale)
    try:
        sentinels = manager(client)
        assert await sentinels.discover_master(MASTER_NAME) == ("127.0.0.1", fresh.port)
        # The lagging sentinel is asked first now (redis-py reorders on every answer; here by
        # hand), and its older answer is passed over.
        sentinels.sentinels.reverse()
        assert sentinels.sentinels[0].connection_pool.connection_kwargs["port"] == (
            stale.sentinel_port
        )
        for _ in range(3):
            assert await sentinels.discover_master(MASTER_NAME) == ("127.0.0.1", fresh.port)
        assert sentinels.epochs[MASTER_NAME] == 2
    finally:
        await close_client(client)


async def test_discovery_uses_an_older_answer_when_no_sentinel_has_a_newer_one(
    stale_and_fresh: tuple[LoneSentinel, LoneSentinel], caplog: pytest.LogCaptureFixture
) -> None:
    stale, fresh = stale_and_fresh
    client = sentinel_client(fresh, stale)
    try:
        sentinels = manager(client)
        assert await sentinels.discover_master(MASTER_NAME) == ("127.0.0.1", fresh.port)
        assert fresh.sentinel is not None
        fresh.sentinel.stop()
        with caplog.at_level(logging.WARNING, logger="meridian.edge.redis"):
            assert await sentinels.discover_master(MASTER_NAME) == ("127.0.0.1", stale.port)
        assert [r.getMessage() for r in caplog.records] == ["redis.sentinel_behind"]
        assert await client.set("still", "writes") is True
    finally:
        await close_client(client)


async def test_a_connection_to_the_old_primary_is_dropped_when_handed_back(
    stale_and_fresh: tuple[LoneSentinel, LoneSentinel], caplog: pytest.LogCaptureFixture
) -> None:
    """redis-py drops only idle connections when it learns of a new primary; one that was
    busy then would go back to the pool still bound to the old one."""
    stale, fresh = stale_and_fresh
    client = sentinel_client(stale, fresh)
    try:
        pool = client.connection_pool
        assert isinstance(pool, BlockingSentinelPool)
        busy = await pool.get_connection()  # type: ignore[no-untyped-call]  # untyped in redis-py
        assert busy.is_connected
        assert busy.port == stale.port
        # The client learns of the new primary while ``busy`` is in use.
        manager(client).sentinels.reverse()
        learnt = await pool.get_master_address()  # type: ignore[no-untyped-call]
        assert learnt == ("127.0.0.1", fresh.port)
        assert busy.is_connected, "redis-py leaves a busy connection where it is"
        with caplog.at_level(logging.INFO, logger="meridian.edge.redis"):
            await pool.release(busy)
        assert not busy.is_connected
        assert "redis.stale_connection_closed" in [r.getMessage() for r in caplog.records]
        await client.set("where", "fresh")
        fresh_node = aioredis.Redis(host="127.0.0.1", port=fresh.port)
        stale_node = aioredis.Redis(host="127.0.0.1", port=stale.port)
        try:
            assert await fresh_node.get("where") == b"fresh"
            assert await stale_node.get("where") is None
        finally:
            await fresh_node.aclose()
            await stale_node.aclose()
    finally:
        await close_client(client)
