"""Acceptance: the edge's state on Redis beyond one server, against real servers.

- **Cluster** (three primaries): two edges share it; limits stay exact for tenants spread
  over every shard; keys and tenants are managed, listed, rotated, revoked and deleted with no
  cross-slot error; a revocation reaches the other edge through cluster pub/sub; every lease
  and reservation is settled.
- **Sentinel** (a primary, two replicas, three sentinels): the primary is killed during load.
  In fail-open mode no request fails; every reservation that survived on the new primary is
  settled to the tokens really used (settles that failed during the failover are sent again);
  no stream slot stays held; the edge follows the new primary without a restart (admissions
  go to Redis again, readiness is green, revocations arrive).

Documented window (README "Redis beyond one server"): between the primary's death and the
promotion (the sentinels' ``down-after-milliseconds`` plus an election, about 2 s here),
the edge decides on its local limits; writes the old primary acknowledged but had not yet
replicated are lost (Redis replication is asynchronous), so a reservation admitted in the
last moment before the crash may be forgotten, never charged twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
import redis.asyncio as aioredis

from services.edge.ratelimit.redis_backend import scope_keys
from services.edge.ratelimit.types import Scope
from services.edge.redisconn import RedisClient, close_client
from services.edge.tenancy.tenants import Limits, TenantPatch, Tier
from tests.integration.conftest import MODEL, Stack, start_stack, stop_stack
from tests.support.inproc import RunningEdge, start_edge
from tests.support.redis_topologies import ClusterTopology, SentinelTopology
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

#: What these tests prove is about Redis; the router must not eject a worker because the one
#: event loop that runs every service was held up during a failover on a loaded machine.
ROUTER_STALE_AFTER_S = 5.0

PROMPT = [{"role": "user", "content": "Tell me about the weather in Seoul today."}]


@dataclass
class Answer:
    status: int
    request_id: str
    total_tokens: int
    body: dict[str, Any]


async def post(http: aiohttp.ClientSession, edge: RunningEdge, key: str, **body: Any) -> Answer:
    async with http.post(
        f"{edge.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": MODEL, "messages": PROMPT, "max_tokens": 4, **body},
    ) as resp:
        data = await resp.json()
        usage = data.get("usage") or {}
        return Answer(
            resp.status,
            resp.headers.get("x-request-id", ""),
            int(usage.get("total_tokens", 0)),
            data,
        )


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=60)
    )


def tenant_scope(tenant: str) -> Scope:
    return Scope("tenant", tenant, f"{{{tenant}}}:t", Limits())


# --- Cluster ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterTopology]:
    topology = ClusterTopology(tmp_path_factory.mktemp("cluster"))
    topology.start()
    yield topology
    topology.stop()


@dataclass
class ClusterPair:
    stack: Stack
    other: RunningEdge
    cluster: ClusterTopology

    @property
    def edges(self) -> tuple[RunningEdge, RunningEdge]:
        return (self.stack.edge, self.other)


@pytest.fixture
async def on_cluster(cluster: ClusterTopology) -> AsyncIterator[ClusterPair]:
    cluster.flush()
    stack = await start_stack(cluster.url, stale_after_s=ROUTER_STALE_AFTER_S)
    other = await start_edge(redis_url=cluster.url, router_address=stack.router.address)
    yield ClusterPair(stack, other, cluster)
    await other.stop()
    await stop_stack(stack)


def slots_of(tenants: list[str]) -> set[int]:
    from redis.crc import key_slot

    return {key_slot(scope_keys(tenant_scope(t))[0].encode()) for t in tenants}


def as_ints(fields: dict[bytes | str, bytes | str]) -> dict[str, int]:
    """A limit window's token hash without its ``#sum``, request id → tokens."""
    out: dict[str, int] = {}
    for k, v in fields.items():
        assert isinstance(k, bytes)
        assert isinstance(v, bytes)
        if k != b"#sum":
            out[k.decode()] = int(v)
    return out


def owners(cluster: ClusterTopology, tenants: list[str]) -> set[int]:
    """The ports of the primaries that hold these tenants' limit windows."""
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        keys = [scope_keys(tenant_scope(t))[0] for t in tenants]
        return {client.get_node_from_key(k).port for k in keys}  # type: ignore[no-untyped-call]
    finally:
        client.close()


async def test_cluster_limits_stay_exact_for_tenants_on_every_shard(
    on_cluster: ClusterPair,
) -> None:
    tenants = [f"tenant-{i}" for i in range(6)]
    assert owners(on_cluster.cluster, tenants) == {n.port for n in on_cluster.cluster.nodes}
    keys = {t: await on_cluster.stack.edge.new_key(t, limits=Limits(rpm=5)) for t in tenants}
    async with session() as http:
        answers = await asyncio.gather(
            *(post(http, on_cluster.edges[i % 2], keys[t]) for t in tenants for i in range(10))
        )
    for n, t in enumerate(tenants):
        mine = answers[n * 10 : (n + 1) * 10]
        assert sorted(a.status for a in mine) == [200] * 5 + [429] * 5, (t, mine[0].body)
    for edge in on_cluster.edges:
        assert edge.counters.limiter_redis_errors == 0
        assert edge.counters.limiter_fail_open == 0


async def test_cluster_concurrent_streams_and_tokens_are_exact_and_all_settled(
    on_cluster: ClusterPair,
) -> None:
    tenants = ["north", "south", "east"]
    keys = {
        t: await on_cluster.stack.edge.new_key(t, limits=Limits(max_streams=3, tpm=100_000))
        for t in tenants
    }
    async with session() as http:
        answers = await asyncio.gather(
            *(
                post(http, on_cluster.edges[i % 2], keys[t], max_tokens=16)
                for t in tenants
                for i in range(8)
            )
        )
    ok = [a for a in answers if a.status == 200]
    assert ok
    assert all(a.status in (200, 429) for a in answers)
    for edge in on_cluster.edges:
        await edge.server.limiter.close()  # every settle sent
        assert edge.counters.settle_failures == 0
    client = on_cluster.stack.edge.redis
    for t in tenants:
        _, tokens, leases = scope_keys(tenant_scope(t))
        assert await client.zcard(leases) == 0, f"{t}: a stream slot is still held"
        settled = as_ints(await client.hgetall(tokens))
        mine = {a.request_id: a.total_tokens for a in ok if a.request_id in settled}
        assert mine == settled, f"{t}: reservations not replaced by the tokens used"
        assert await client.hget(tokens, "#sum") == str(sum(settled.values())).encode()


async def test_cluster_keys_and_tenants_are_managed_without_cross_slot_errors(
    on_cluster: ClusterPair,
) -> None:
    directory = on_cluster.stack.edge.directory
    names = [f"org-{i}" for i in range(8)]
    assert len(slots_of(names)) > 1
    for name in names:
        await on_cluster.stack.edge.new_key(name)
    assert [t.tenant_id for t in await directory.list_tenants()] == sorted([*names, "acme"])
    await directory.update_tenant("org-1", TenantPatch(tier=Tier.HIGH))
    assert (await directory.require_tenant("org-1")).tier == "high"
    raw, record = await directory.create_key("org-2", name="ci")
    assert record.key_id in {k.key_id for k in await directory.list_keys("org-2")}
    new_raw, _ = await directory.rotate_key(record.key_id, grace_s=60)
    await directory.delete_tenant("org-3")
    assert await directory.get_tenant("org-3") is None
    async with session() as http:
        assert (await post(http, on_cluster.other, raw)).status == 200
        assert (await post(http, on_cluster.other, new_raw)).status == 200
        before = on_cluster.other.counters.auth_invalidations
        await directory.revoke_key(record.key_id)
        # Pub/sub on the cluster: the other edge drops the key at once, not after its TTL.
        await eventually(lambda: on_cluster.other.counters.auth_invalidations > before)
        refused = await post(http, on_cluster.other, raw)
        assert refused.status == 401
        assert refused.body["error"]["code"] == "invalid_api_key"


# --- Sentinel ---------------------------------------------------------------------------------


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[SentinelTopology]:
    topology = SentinelTopology(tmp_path / "sentinel")
    topology.start()
    yield topology
    topology.stop()


@dataclass
class Load:
    """Clients (each sending, waiting for the answer, pausing) until told to stop; every
    answer kept with its start and end times."""

    edge: RunningEdge
    key: str
    clients: int = 6
    pause_s: float = 0.1
    answers: list[tuple[float, float, Answer]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        async with session() as http:
            await asyncio.gather(*(self._client(http) for _ in range(self.clients)))

    async def _client(self, http: aiohttp.ClientSession) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                answer = await post(http, self.edge, self.key, max_tokens=8)
            except (aiohttp.ClientError, TimeoutError) as err:
                self.errors.append(repr(err))
                continue
            self.answers.append((start, time.monotonic(), answer))
            await asyncio.sleep(self.pause_s)  # under the edge's per-IP request rate


@pytest.mark.parametrize("fault", ["primary-killed", "failover-ordered"])
async def test_sentinel_failover_during_load_fails_nothing_and_settles_every_reservation(
    sentinel: SentinelTopology, fault: str
) -> None:
    """``primary-killed``: SIGKILL, the sentinels notice and promote a replica.
    ``failover-ordered``: SENTINEL FAILOVER; the old primary lives on as a replica, so the
    edge's connections to it answer READONLY until they move to the new one."""
    stack = await start_stack(sentinel.url, stale_after_s=ROUTER_STALE_AFTER_S)
    try:
        edge = stack.edge
        key = await edge.new_key("load", limits=Limits(rpm=1_000_000, tpm=100_000_000))
        other_key = await edge.new_key("other")
        load = Load(edge, key)
        runner = asyncio.get_running_loop().create_task(load.run())
        await asyncio.sleep(1.5)
        old = sentinel.primary_port()
        killed_at = time.monotonic()
        if fault == "primary-killed":
            sentinel.node(old).kill()
        else:
            sentinel.order_failover()
        new = await asyncio.to_thread(sentinel.wait_for_new_primary, old)
        promoted_s = time.monotonic() - killed_at
        # The edge follows the new primary by itself: admissions reach Redis again.
        fail_open = edge.counters.limiter_fail_open
        await asyncio.sleep(2.5)
        steady = edge.counters.limiter_fail_open
        await asyncio.sleep(1.0)
        load.stop.set()
        await runner
        pool = edge.redis.connection_pool  # type: ignore[union-attr]  # a Sentinel-backed Redis
        assert getattr(pool, "master_address", None) == ("127.0.0.1", new)
        assert edge.counters.limiter_fail_open == steady, "still deciding locally"
        assert fail_open <= steady

        failed = [a for _, _, a in load.answers if a.status != 200]
        assert not load.errors, load.errors[:3]
        assert not failed, [a.body for a in failed[:3]]
        during = [a for s, _, a in load.answers if killed_at <= s <= killed_at + promoted_s]
        assert during, "no request ran during the failover"
        longest = max(end - start for start, end, _ in load.answers)
        print(
            f"\nsentinel {fault}: promoted after {promoted_s:.2f}s; "
            f"{len(load.answers)} requests, 0 failed, {len(during)} during the failover, "
            f"longest {longest:.2f}s; fail-open decisions {edge.counters.limiter_fail_open}, "
            f"settle retries {edge.counters.settle_retries}, "
            f"settles resent after the failover {edge.counters.settles_resent}"
        )

        await edge.server.limiter.close()
        assert edge.counters.settle_failures == 0
        primary = aioredis.Redis(host="127.0.0.1", port=new)
        try:
            _, tokens, leases = scope_keys(tenant_scope("load"))
            assert await primary.zcard(leases) == 0
            settled = as_ints(await primary.hgetall(tokens))
            used = {a.request_id: a.total_tokens for _, _, a in load.answers}
            assert settled, "nothing reached the new primary"
            unsettled = {rid: v for rid, v in settled.items() if used.get(rid) != v}
            assert not unsettled, f"reservations never settled: {list(unsettled.items())[:3]}"
            assert await primary.hget(tokens, "#sum") == str(sum(settled.values())).encode()
        finally:
            await primary.aclose()

        async with aiohttp.ClientSession() as http:
            async with http.get(f"{edge.url}/readyz") as resp:
                assert resp.status == 200, await resp.text()
            record = (await edge.directory.list_keys("other"))[0]
            assert (await post(http, edge, other_key)).status == 200
            before = edge.counters.auth_invalidations
            await edge.directory.revoke_key(record.key_id)
            await eventually(lambda: edge.counters.auth_invalidations > before)
            assert (await post(http, edge, other_key)).status == 401
    finally:
        await stop_stack(stack)


async def test_a_sentinel_url_reaches_the_primary(sentinel: SentinelTopology) -> None:
    from services.edge.server import connect_redis

    client: RedisClient = connect_redis(sentinel.url)
    try:
        await client.set("meridian:probe", "1")
        primary = aioredis.Redis(host="127.0.0.1", port=sentinel.primary_port())
        try:
            assert await primary.get("meridian:probe") == b"1"
        finally:
            await primary.aclose()
    finally:
        await close_client(client)
