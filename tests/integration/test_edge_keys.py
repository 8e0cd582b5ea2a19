"""Acceptance: a revoked key is refused by every replica within seconds; tenant policy
(allowed models, data residency, disabled tenants) holds on the real path."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from services.edge.tenancy.tenants import Tenant, TenantPatch
from tests.integration.conftest import MODEL, Stack
from tests.support.builders import TEST_ADMIN_TOKEN
from tests.support.inproc import RunningEdge, start_edge

HELLO = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


@pytest.fixture
async def second(stack: Stack, redis_url: str) -> AsyncIterator[RunningEdge]:
    edge = await start_edge(redis_url=redis_url, router_address=stack.router.address)
    yield edge
    await edge.stop()


async def status(http: aiohttp.ClientSession, edge: RunningEdge, key: str, **body: object) -> int:
    async with http.post(
        f"{edge.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={**HELLO, **body},
    ) as resp:
        await resp.read()
        return resp.status


async def test_a_revoked_key_is_refused_by_both_replicas_within_5_seconds(
    stack: Stack, second: RunningEdge
) -> None:
    edges = (stack.edge, second)
    key = await stack.edge.new_key("acme")
    async with aiohttp.ClientSession() as http:
        assert [await status(http, e, key) for e in edges] == [200, 200]  # cached on both
        key_id = (await second.server.auth.verify(key)).key.key_id
        async with http.delete(
            f"{stack.edge.admin_url}/admin/keys/{key_id}",
            headers={"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"},
        ) as resp:
            assert resp.status == 200
        revoked_at = time.monotonic()
        refused: dict[int, float] = {}
        while len(refused) < 2 and time.monotonic() - revoked_at < 5.0:
            for i, e in enumerate(edges):
                if i not in refused and await status(http, e, key) == 401:
                    refused[i] = time.monotonic() - revoked_at
    assert sorted(refused) == [0, 1]
    assert max(refused.values()) < 5.0


async def test_residency_sends_a_tenant_only_to_its_allowed_regions(stack: Stack) -> None:
    key = await stack.edge.new_key("eu-only", allowed_regions=("us",))
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json=HELLO,
        ) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["x-meridian-region"] == "us"  # kr is nearer, but not allowed


async def test_a_model_outside_the_tenant_allowance_looks_like_no_model(stack: Stack) -> None:
    key = await stack.edge.new_key("narrow", allowed_models=("some-other-model",))
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{stack.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json=HELLO,
        ) as resp,
    ):
        assert resp.status == 404
        error = (await resp.json())["error"]
    assert error["code"] == "model_not_found"
    assert "do not have access" in error["message"]
    assert stack.edge.counters.models_not_allowed == 1


async def test_models_lists_what_the_tenant_may_use_and_retrieve_finds_one(stack: Stack) -> None:
    """/v1/models is what a request of this tenant could reach: its allowed models only, each
    in its allowed regions; GET /v1/models/{id} (the SDK's models.retrieve) is one entry, a
    404 model_not_found for a model it may not see."""

    async def get(key: str, path: str) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{stack.base_url}{path}", headers={"Authorization": f"Bearer {key}"}) as r,
        ):
            return r.status, await r.json()

    status, listed = await get(stack.key, "/models")
    assert status == 200
    (entry,) = listed["data"]
    assert entry["id"] == MODEL
    assert set(entry["regions"]) == {"kr", "jp", "us"}
    status, one = await get(stack.key, f"/models/{MODEL}")
    assert (status, one) == (200, entry)
    us_only = await stack.edge.new_key("us-only", allowed_regions=("us",))
    status, listed = await get(us_only, "/models")
    assert [m["regions"] for m in listed["data"]] == [["us"]]
    narrow = await stack.edge.new_key("narrow-list", allowed_models=("some-other-model",))
    status, listed = await get(narrow, "/models")
    assert (status, listed["data"]) == (200, [])
    status, missing = await get(narrow, f"/models/{MODEL}")
    assert status == 404
    assert missing["error"]["code"] == "model_not_found"
    status, missing = await get(stack.key, "/models/org/no-such-model")
    assert status == 404
    assert missing["error"]["param"] == "model"


async def test_keys_of_a_disabled_tenant_are_forbidden(stack: Stack) -> None:
    await stack.edge.directory.ensure_tenant(Tenant(tenant_id="gone"))
    key = await stack.edge.new_key("gone")
    await stack.edge.directory.update_tenant("gone", TenantPatch(disabled=True))
    stack.edge.server.auth.invalidate("tenant:gone")
    async with aiohttp.ClientSession() as http:
        assert await status(http, stack.edge, key) == 403
