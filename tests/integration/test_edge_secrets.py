"""Acceptance: no raw API key anywhere in Redis or in the edge's logs.

Keys are created, used (good and bad), rotated, revoked and rate-limited while every log
record of every logger is captured, at DEBUG, through the services' JSON formatter; then every
Redis key and every value of every type is scanned for any of the raw keys.
"""

from __future__ import annotations

import io
import logging

import aiohttp
import redis.asyncio as aioredis

from services.common.logs import JsonFormatter
from services.edge.tenancy.tenants import Limits
from tests.integration.conftest import MODEL, Stack
from tests.support.builders import TEST_ADMIN_TOKEN


def as_bytes(value: object) -> bytes:
    """A Redis reply as bytes: the client has no ``decode_responses``, so that is what Redis
    answers (the client's types also allow ``str``)."""
    assert isinstance(value, bytes), value
    return value


async def redis_dump(client: aioredis.Redis) -> bytes:
    """Every key name and every value in the database, whatever its type."""
    out = bytearray()
    async for key in client.scan_iter(count=500):
        name = as_bytes(key)
        out += name + b"\n"
        kind = as_bytes(await client.type(name)).decode()
        if kind == "string":
            out += as_bytes(await client.get(name) or b"")
        elif kind == "hash":
            for k, v in (await client.hgetall(name)).items():
                out += as_bytes(k) + b"=" + as_bytes(v) + b"\n"
        elif kind == "set":
            out += b"\n".join(map(as_bytes, await client.smembers(name)))
        elif kind == "zset":
            # The members; their scores are numbers, which no raw key can be.
            out += b"\n".join(map(as_bytes, await client.zrange(name, 0, -1)))
        elif kind == "list":
            out += b"\n".join(map(as_bytes, await client.lrange(name, 0, -1)))
        else:
            raise AssertionError(f"unexpected Redis type {kind} for {name!r}")
        out += b"\n"
    return bytes(out)


async def test_no_raw_key_reaches_redis_or_the_logs(stack: Stack, redis_url: str) -> None:
    captured = io.StringIO()
    handler = logging.StreamHandler(captured)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    admin = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}
    raw_keys = [stack.key]
    try:
        limited = await stack.edge.new_key("limited", limits=Limits(rpm=1))
        raw_keys.append(limited)
        async with aiohttp.ClientSession() as http:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            for key in (stack.key, limited, limited, limited[:-1] + "A", "mk-short"):
                async with http.post(
                    f"{stack.base_url}/chat/completions",
                    headers={"Authorization": f"Bearer {key}"},
                    json={**body, "max_tokens": 2},
                ) as resp:
                    await resp.read()
            async with http.post(
                f"{stack.edge.admin_url}/admin/tenants/acme/keys", headers=admin, json={}
            ) as resp:
                created = await resp.json()
                raw_keys.append(created["key"])
            async with http.post(
                f"{stack.edge.admin_url}/admin/keys/{created['key_id']}/rotate",
                headers=admin,
                json={"grace_s": 5},
            ) as resp:
                raw_keys.append((await resp.json())["key"])
            async with http.delete(
                f"{stack.edge.admin_url}/admin/keys/{created['key_id']}", headers=admin
            ) as resp:
                assert resp.status == 200
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)

    logs = captured.getvalue()
    assert "chat.completed" in logs  # the capture did see the edge's events
    client = aioredis.Redis.from_url(redis_url)
    dump = await redis_dump(client)
    await client.aclose()
    assert b"meridian:apikey:" in dump
    for raw in raw_keys:
        assert raw not in logs
        assert raw.encode() not in dump
        assert raw[3:20] not in logs  # not even a recognisable part of it
        assert raw[3:20].encode() not in dump
