"""Stored responses against a real Redis (the tests' own): kept per tenant with a TTL, too
large ones refused, and Redis down soft for storing, a 503 for reading."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from services.common.clock import SYSTEM_CLOCK
from services.common.errors import Unavailable
from services.edge.breaker import Breaker
from services.edge.counters import EdgeCounters
from services.edge.responses_store import MAX_RECORD_BYTES, ResponseStore, StoredResponse

RID = "resp_" + "ab" * 16


def stored(text: str = "hi", response_id: str = RID) -> StoredResponse:
    return StoredResponse(
        response={"id": response_id, "output_text": text},
        context=[{"role": "user", "content": "q"}, {"role": "assistant", "content": text}],
        input_items=[{"type": "message", "role": "user", "content": [], "id": "item_0"}],
    )


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_a_stored_response_is_read_back_by_its_tenant_only(redis: aioredis.Redis) -> None:
    store = ResponseStore(redis, ttl_s=60)
    assert await store.put("t1", stored())
    got = await store.get("t1", RID)
    assert got == stored()
    assert await store.get("t2", RID) is None, "another tenant's id is not found"
    ttl = await redis.ttl(f"meridian:resp:{{t1}}:{RID}")
    assert 0 < ttl <= 60


async def test_deleting_says_whether_there_was_one(redis: aioredis.Redis) -> None:
    store = ResponseStore(redis)
    await store.put("t1", stored())
    assert await store.delete("t1", RID)
    assert not await store.delete("t1", RID)
    assert await store.get("t1", RID) is None


async def test_a_record_past_the_limit_is_not_stored(redis: aioredis.Redis) -> None:
    store = ResponseStore(redis)
    assert not await store.put("t1", stored("x" * MAX_RECORD_BYTES))
    assert await store.get("t1", RID) is None


async def test_non_ascii_text_is_stored_as_utf8_not_escapes(redis: aioredis.Redis) -> None:
    """Korean text is 3 bytes a character in the record, not the 6 of a \\uXXXX escape."""
    store = ResponseStore(redis)
    text = "안녕하세요 🌏" * 1000
    assert await store.put("t1", stored(text))
    raw = await redis.get(f"meridian:resp:{{t1}}:{RID}")
    assert isinstance(raw, bytes)
    assert text.encode() in raw
    got = await store.get("t1", RID)
    assert got == stored(text)
    assert got is not None
    assert got.size == len(raw) < 3 * len(text.encode()), "escapes would make it 4x"


async def test_a_lone_surrogate_is_stored_escaped_and_read_back(redis: aioredis.Redis) -> None:
    """Valid JSON ("\\ud800") but not UTF-8: the record falls back to ASCII escapes."""
    store = ResponseStore(redis)
    assert await store.put("t1", stored("a\ud800b"))
    assert await store.get("t1", RID) == stored("a\ud800b")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_redis_down_fails_storing_softly_and_reading_with_a_503() -> None:
    client = aioredis.Redis(host="127.0.0.1", port=_closed_port(), socket_timeout=0.5)
    store = ResponseStore(client)
    try:
        assert not await store.put("t1", stored())
        with pytest.raises(Unavailable) as raised:
            await store.get("t1", RID)
        assert raised.value.http_status == 503
    finally:
        await client.aclose()


@pytest.mark.parametrize("ttl_s", [0, 31 * 24 * 3600])
def test_a_ttl_outside_one_second_to_thirty_days_is_refused(ttl_s: int) -> None:
    with pytest.raises(ValueError, match="TTL"):
        ResponseStore(aioredis.Redis(), ttl_s=ttl_s)


async def test_with_the_breaker_open_a_response_does_not_wait_for_redis() -> None:
    """After one failure the shared breaker is open: the next calls skip Redis at once."""
    counters = EdgeCounters()
    breaker = Breaker(clock=SYSTEM_CLOCK, counters=counters, open_for_s=60.0)
    client = aioredis.Redis(host="127.0.0.1", port=_closed_port(), socket_timeout=0.5)
    store = ResponseStore(client, breaker=breaker)
    try:
        assert not await store.put("t1", stored())
        assert counters.redis_breaker_opened == 1
        calls: list[str] = []
        client.set = lambda *a, **k: calls.append("set")  # type: ignore[method-assign,assignment]
        assert not await store.put("t1", stored())
        with pytest.raises(Unavailable):
            await store.get("t1", RID)
        assert calls == [], "Redis was not called while the breaker is open"
    finally:
        await client.aclose()
