"""Revoking a key, or disabling a tenant, ends the requests already running under it — over
the in-loop stack (real Redis, pub/sub, gRPC workers), with the directory's own calls.

Before, authentication happened once per request: a revoked key could open no new request,
but its streams ran on to their end (with ``max_tokens`` in the thousands, minutes). Now a
live stream gets one OpenAI-style error event and ``[DONE]``; a request with no response yet
its 401/403; the worker's generation is cancelled and the usage settled. Other keys' and
tenants' requests, and a rotated key within its grace, go on untouched.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from services.edge.tenancy.tenants import Limits, TenantPatch
from tests.integration.conftest import MODEL, Stack
from tests.support.wait import eventually

#: Far more than the sim generates in the test (about 800 tokens a second).
LONG_TOKENS = 6000

LONG: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "go on"}],
    "stream": True,
    "ignore_eos": True,
    "max_tokens": LONG_TOKENS,
}


class Reader:
    """One streaming request, read in the background: its frames and when it ended."""

    def __init__(self, http: aiohttp.ClientSession, stack: Stack, key: str) -> None:
        self.frames: list[str] = []
        self.first = asyncio.Event()
        self.request_id = ""
        self._task = asyncio.create_task(
            self._read(http, f"{stack.base_url}/chat/completions", key)
        )

    async def _read(self, http: aiohttp.ClientSession, url: str, key: str) -> None:
        async with http.post(url, headers={"Authorization": f"Bearer {key}"}, json=LONG) as resp:
            assert resp.status == 200, await resp.text()
            self.request_id = resp.headers["x-request-id"]
            async for line in resp.content:
                text = line.decode().strip()
                if text.startswith("data: "):
                    self.frames.append(text[6:])
                    self.first.set()

    async def ended(self, timeout_s: float) -> list[str]:
        await asyncio.wait_for(self._task, timeout_s)
        return self.frames

    @property
    def running(self) -> bool:
        return not self._task.done()

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def running(stack: Stack) -> int:
    return sum(w.engine.load().running for w in stack.workers.values())


def the_error(frames: list[str]) -> dict[str, Any]:
    """The stream's one error event, just before ``[DONE]``, after some content."""
    assert frames[-1] == "[DONE]"
    assert sum('"error"' in f for f in frames) == 1, frames[-3:]
    assert json.loads(frames[-3])["choices"][0]["delta"].get("content")  # tokens before it
    error: dict[str, Any] = json.loads(frames[-2])["error"]
    return error


async def test_revoking_a_key_ends_its_streams_and_no_one_elses(
    stack: Stack, redis_url: str
) -> None:
    edge = stack.edge
    revoked = await edge.new_key("metered", limits=Limits(tpm=10_000_000, max_streams=10))
    (record,) = await edge.directory.list_keys("metered")
    sibling = await edge.new_key("metered")  # the same tenant's other key
    async with aiohttp.ClientSession() as http:
        cut = Reader(http, stack, revoked)
        also_cut = Reader(http, stack, revoked)
        others = [Reader(http, stack, sibling), Reader(http, stack, stack.key)]
        try:
            for r in (cut, also_cut, *others):
                await asyncio.wait_for(r.first.wait(), 10.0)
            assert running(stack) == 4
            loop = asyncio.get_running_loop()
            revoked_at = loop.time()
            await edge.directory.revoke_key(record.key_id)

            for r in (cut, also_cut):
                error = the_error(await r.ended(5.0))
                assert error["code"] == "invalid_api_key"
                assert error["type"] == "invalid_request_error"
                assert "revoked" in error["message"]
            ended_after = loop.time() - revoked_at
            # The generations stopped (uncut, they would run for seconds more); the others go on.
            await eventually(lambda: running(stack) == 2, timeout_s=2.0)
            await asyncio.sleep(0.3)
            assert all(r.running for r in others)
            assert not any('"error"' in f for r in others for f in r.frames)
        finally:
            for r in (cut, also_cut, *others):
                await r.stop()
    assert ended_after < 5.0
    assert edge.counters.revoked_streams_cut == 2
    assert edge.counters.revoked_requests_cut == 0

    # Each cut stream's usage was settled with what it used, and its stream slot freed.
    client = aioredis.Redis.from_url(redis_url)
    try:
        for r in (cut, also_cut):
            used = int(await client.hget("meridian:rl:{metered}:t:n", r.request_id) or 0)
            assert 0 < used < LONG_TOKENS
        assert await client.zcard("meridian:rl:{metered}:t:c") == 0
    finally:
        await client.aclose()


async def test_a_request_with_no_response_yet_gets_the_401(stack: Stack) -> None:
    edge = stack.edge
    key = await edge.new_key("batch")
    (record,) = await edge.directory.list_keys("batch")
    async with aiohttp.ClientSession() as http:
        whole = asyncio.create_task(
            http.post(
                f"{stack.base_url}/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={**LONG, "stream": False},
            )
        )
        await eventually(lambda: running(stack) >= 1, timeout_s=5.0)
        await edge.directory.revoke_key(record.key_id)
        async with await asyncio.wait_for(whole, 5.0) as resp:
            assert resp.status == 401
            body = await resp.json()
    assert body["error"]["code"] == "invalid_api_key"
    await eventually(lambda: running(stack) == 0, timeout_s=2.0)
    assert edge.counters.revoked_requests_cut == 1


async def test_disabling_a_tenant_ends_its_streams_with_tenant_disabled(stack: Stack) -> None:
    edge = stack.edge
    key = await edge.new_key("suspended")
    async with aiohttp.ClientSession() as http:
        cut, other = Reader(http, stack, key), Reader(http, stack, stack.key)
        try:
            await asyncio.wait_for(cut.first.wait(), 10.0)
            await asyncio.wait_for(other.first.wait(), 10.0)
            await edge.directory.update_tenant("suspended", TenantPatch(disabled=True))
            error = the_error(await cut.ended(5.0))
            assert other.running
        finally:
            await cut.stop()
            await other.stop()
    assert error["code"] == "tenant_disabled"
    assert error["type"] == "permission_error"


async def test_a_rotated_key_within_its_grace_keeps_its_stream(stack: Stack) -> None:
    """Rotation publishes a key event too; the old key is still usable for its grace, so its
    stream is checked and left alone."""
    edge = stack.edge
    key = await edge.new_key("rotating")
    (record,) = await edge.directory.list_keys("rotating")
    async with aiohttp.ClientSession() as http:
        stream = Reader(http, stack, key)
        try:
            await asyncio.wait_for(stream.first.wait(), 10.0)
            checks = edge.counters.auth_rechecks
            await edge.directory.rotate_key(record.key_id, grace_s=60.0)
            await eventually(lambda: edge.counters.auth_rechecks > checks, timeout_s=5.0)
            await asyncio.sleep(0.3)
            assert stream.running
            assert not any('"error"' in f for f in stream.frames)
        finally:
            await stream.stop()
    assert edge.counters.revoked_streams_cut == 0


async def test_a_rotated_key_s_stream_ends_when_its_grace_runs_out(stack: Stack) -> None:
    """No event comes when a rotation's grace period ends: the check the rotation made arms a
    timer for it, and the stream ends then (not at its own end), saying the key expired; a
    stream on another key goes on."""
    edge = stack.edge
    key = await edge.new_key("graceful")
    (record,) = await edge.directory.list_keys("graceful")
    async with aiohttp.ClientSession() as http:
        stream, other = Reader(http, stack, key), Reader(http, stack, stack.key)
        try:
            await asyncio.wait_for(stream.first.wait(), 10.0)
            await asyncio.wait_for(other.first.wait(), 10.0)
            _, successor = await edge.directory.rotate_key(record.key_id, grace_s=1.0)
            await asyncio.sleep(0.5)
            assert stream.running  # within its grace
            error = the_error(await stream.ended(5.0))
            assert other.running
        finally:
            await stream.stop()
            await other.stop()
    assert error["code"] == "invalid_api_key"
    assert "expired" in error["message"]
    assert edge.counters.revoked_streams_cut == 1
    assert successor.key_id != record.key_id


async def test_a_stream_opened_on_a_key_that_expires_ends_when_it_does(stack: Stack) -> None:
    """A key given an expiry at creation: a stream admitted under it arms the timer itself
    (no check has run for it yet) and ends at that time."""
    edge = stack.edge
    await edge.new_key("expiring")
    expires_ms = int(time.time() * 1000) + 1500
    key, _ = await edge.directory.create_key("expiring", expires_ms=expires_ms)
    async with aiohttp.ClientSession() as http:
        stream = Reader(http, stack, key)
        try:
            await asyncio.wait_for(stream.first.wait(), 10.0)
            checks = edge.counters.auth_rechecks
            error = the_error(await stream.ended(6.0))
        finally:
            await stream.stop()
    assert time.time() * 1000 >= expires_ms
    # the timer's check (an event's, before the expiry, would have found the key usable)
    assert edge.counters.auth_rechecks > checks
    assert error["code"] == "invalid_api_key"
    assert "expired" in error["message"]
