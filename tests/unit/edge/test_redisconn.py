"""The Redis URL names the topology (one server, Sentinel, Cluster); a bad one is refused
before the edge starts, with a message that says what is wrong (and no password in it)."""

from __future__ import annotations

import dataclasses

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from services.edge.main import build_parser
from services.edge.ratelimit.redis_backend import scope_keys
from services.edge.ratelimit.types import Scope
from services.edge.redisconn import (
    BlockingSentinelPool,
    RedisTarget,
    Topology,
    connect,
    parse_redis_url,
)
from services.edge.tenancy.tenants import Limits


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", RedisTarget(topology=Topology.STANDALONE, url="", db=0)),
        (
            "rediss://:pw@redis.example:6380/2",
            RedisTarget(topology=Topology.STANDALONE, url="", db=2),
        ),
        ("unix:///run/redis.sock?db=3", RedisTarget(topology=Topology.STANDALONE, url="", db=3)),
        (
            "redis+sentinel://s1:26379,s2:26379,[::1]:26380/meridian/1",
            RedisTarget(
                topology=Topology.SENTINEL,
                url="",
                hosts=(("s1", 26379), ("s2", 26379), ("::1", 26380)),
                master="meridian",
                db=1,
            ),
        ),
        (
            "rediss+sentinel://app:secret@s1:26379/mymaster?sentinel_auth=yes",
            RedisTarget(
                topology=Topology.SENTINEL,
                url="",
                hosts=(("s1", 26379),),
                master="mymaster",
                tls=True,
                username="app",
                password="secret",
                sentinel_auth=True,
            ),
        ),
        (
            "redis+cluster://:pw@n1:7000,n2:7001",
            RedisTarget(
                topology=Topology.CLUSTER,
                url="",
                hosts=(("n1", 7000), ("n2", 7001)),
                password="pw",
            ),
        ),
        (
            "redis+cluster://n1:7000/0",
            RedisTarget(topology=Topology.CLUSTER, url="", hosts=(("n1", 7000),)),
        ),
    ],
)
def test_each_url_form_names_its_topology(url: str, expected: RedisTarget) -> None:
    got = parse_redis_url(url)
    assert got == dataclasses.replace(expected, url=url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:6379", "expected redis://"),
        ("127.0.0.1:6379", "expected redis://"),
        ("redis+sentinel://s1:26379", "give the master's name"),
        ("redis+sentinel://s1:26379/a/b/c", "give the master's name"),
        ("redis+sentinel://s1:26379/m/x", "database 'x' must be a number"),
        ("redis+sentinel://s1/m", "'s1' is not HOST:PORT"),
        ("redis+sentinel://s1:0/m", "port '0' must be 1..65535"),
        ("redis+sentinel://s1:99999/m", "port '99999' must be 1..65535"),
        ("redis+sentinel://s1:1,s1:1/m", "listed twice"),
        ("redis+sentinel://s1:1,/m", "'' is not HOST:PORT"),
        ("redis+sentinel://s1:1/m?sentinel_auth=maybe", "sentinel_auth must be yes or no"),
        ("redis+sentinel://s1:1/m?timeout=3", "unknown option 'timeout'"),
        ("redis+cluster://n1:7000/1", "only database 0"),
        ("redis+cluster://n1:7000?sentinel_auth=yes", "sentinel_auth is for redis+sentinel"),
        ("redis://127.0.0.1:6379/x", "database 'x' must be a number"),
    ],
)
def test_a_bad_url_is_refused_with_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        parse_redis_url(url)


def test_errors_never_show_the_password() -> None:
    with pytest.raises(ValueError, match=r"\*\*\*") as info:
        parse_redis_url("redis+cluster://app:hunter2@n1:7000/5")
    assert "hunter2" not in str(info.value)


def test_the_edge_flag_refuses_a_bad_url_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--router", "127.0.0.1:1", "--redis-url", "redis+cluster://x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--redis-url" in err
    assert "'x' is not HOST:PORT" in err


async def test_each_topology_gets_redis_pys_own_client() -> None:
    standalone = connect(parse_redis_url("redis://127.0.0.1:1/0"))
    sentinel = connect(parse_redis_url("redis+sentinel://127.0.0.1:1/meridian"))
    cluster = connect(parse_redis_url("redis+cluster://127.0.0.1:1"))
    try:
        assert isinstance(standalone, Redis)
        assert isinstance(sentinel, Redis)
        assert isinstance(sentinel.connection_pool, BlockingSentinelPool)
        assert sentinel.connection_pool.service_name == "meridian"
        assert isinstance(cluster, RedisCluster)
    finally:
        for client in (standalone, sentinel, cluster):
            await client.aclose()


@pytest.mark.parametrize("tenant", ["acme", "a:b", "x{y", "{weird}", "tenant-with-long-name" * 3])
def test_every_limit_script_touches_one_hash_slot(tenant: str) -> None:
    """A Cluster runs a script only if all its keys are in one slot: a request's key scope and
    tenant scope (what one admission touches) share the tenant's hash tag."""
    from services.edge.stages.admit import scopes_for

    class _Key:
        key_id = "k1"

    class _Tenant:
        tenant_id = tenant
        limits = Limits(rpm=1)

    class _Principal:
        key = _Key()
        tenant = _Tenant()
        key_limits = Limits(rpm=1)

    scopes: tuple[Scope, ...] = scopes_for(_Principal())  # type: ignore[arg-type]
    keys = [k for scope in scopes for k in scope_keys(scope)]
    assert len({key_slot(k.encode()) for k in keys}) == 1
