"""Which Redis the edge keeps its state in, from one URL: one server, a Sentinel-managed
primary, or a Redis Cluster — each with redis-py's own client for it.

    redis://[user:pass@]HOST:PORT/DB          one server (rediss:// for TLS, unix://PATH?db=N)
    redis+sentinel://[user:pass@]H:P[,H:P…]/MASTER[/DB]
                                              the primary that the sentinels at H:P name
                                              MASTER; the client asks them again after a
                                              failover (rediss+sentinel:// for TLS)
    redis+cluster://[user:pass@]H:P[,H:P…]    a Redis Cluster; any reachable node is enough
                                              to find the others (rediss+cluster:// for TLS)

Credentials in the URL are the data nodes'; sentinels are asked without them (sentinels
usually run without ``requirepass``; say so in the URL's query with ``sentinel_auth=yes`` to
send the same credentials to them). :func:`parse_redis_url` validates everything before the
edge starts, with a message naming what is wrong; :func:`connect` builds the client.

What the edge needs of every topology, and how each provides it:

- **one hash slot per script**: every Lua script's keys carry the tenant's hash tag
  (``{tenant}``), so a Cluster runs each admission on one shard (see
  :mod:`services.edge.ratelimit.redis_backend`); pipelines of independent commands are
  split per node by the Cluster client.
- **fail over without a restart**: the Sentinel pool asks the sentinels for the primary on
  every new connection and drops idle connections to an old one; one immediate retry on a
  connection error replaces a connection that died with its server; the edge also listens
  for the sentinels' ``+switch-master`` and moves at once (:func:`follow_failovers`); it
  never goes back to a sentinel's older answer (:class:`EpochSentinel`) nor reuses a
  connection bound to an old primary (:class:`BlockingSentinelPool`). A
  settle the old primary took and lost is sent again (see the limiter). The Cluster client
  re-reads the slot map on ``MOVED``/connection errors.
- **revocation pub/sub**: PUBLISH/SUBSCRIBE; on a Cluster, messages published on any node
  reach subscribers on every node, and redis-py's cluster pub/sub picks the node for us.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio import BlockingConnectionPool
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff

from services.common.logs import event

#: Every client the edge's state code accepts. Both speak the same commands for what the edge
#: does (strings, hashes, sets, sorted sets, scripts, pipelines, pub/sub).
RedisClient = aioredis.Redis | RedisCluster

REDIS_FAILURES: tuple[type[BaseException], ...] = (
    redis.exceptions.RedisError,
    redis.exceptions.RedisClusterException,  # not a RedisError: "no reachable node" at (re)start
    OSError,
)
"""What a Redis call raises when Redis is down, slow or unreachable, on every topology: each
caller's failure policy (breaker, fail-open, 503) must see all of it, or a whole cluster
being down is a 500."""

log = logging.getLogger("meridian.edge.redis")


class Topology(enum.StrEnum):
    STANDALONE = "standalone"
    SENTINEL = "sentinel"
    CLUSTER = "cluster"


_SCHEMES: dict[str, tuple[Topology, bool]] = {
    "redis": (Topology.STANDALONE, False),
    "rediss": (Topology.STANDALONE, True),
    "unix": (Topology.STANDALONE, False),
    "redis+sentinel": (Topology.SENTINEL, False),
    "rediss+sentinel": (Topology.SENTINEL, True),
    "redis+cluster": (Topology.CLUSTER, False),
    "rediss+cluster": (Topology.CLUSTER, True),
}
EXPECTED = (
    "expected redis://HOST:PORT/DB, rediss://…, unix://PATH, "
    "redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER[/DB] or redis+cluster://HOST:PORT[,…]"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisTarget:
    """A validated Redis URL: the topology and what its client needs."""

    topology: Topology
    url: str = field(repr=False)  # standalone: handed to redis-py as given
    hosts: tuple[tuple[str, int], ...] = ()  # sentinels, or cluster seed nodes
    master: str = ""
    db: int = 0
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_auth: bool = False


def parse_redis_url(url: str) -> RedisTarget:
    """Validate ``url``; raises ValueError with a message that says what is wrong."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise ValueError(f"{shown_url(url)!r}: {EXPECTED}")
    topology, tls = _SCHEMES[scheme.lower()]
    if topology is Topology.STANDALONE:
        return _standalone(url)
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, at, hostlist = netloc.rpartition("@")
    if not at:
        userinfo, hostlist = "", netloc
    username, password = _credentials(userinfo)
    hosts = _hosts(hostlist, url)
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"sentinel_auth"})
    if unknown:
        raise ValueError(f"{shown_url(url)!r}: unknown option {unknown[0]!r}")
    sentinel_auth = _yes_no(query.get("sentinel_auth", ["no"])[-1], url)
    segments = [s for s in parts.path.split("/") if s]
    if topology is Topology.CLUSTER:
        if segments not in ([], ["0"]):
            raise ValueError(
                f"{shown_url(url)!r}: a Redis Cluster has only database 0; drop {parts.path!r}"
            )
        if sentinel_auth:
            raise ValueError(f"{shown_url(url)!r}: sentinel_auth is for redis+sentinel:// URLs")
        return RedisTarget(
            topology=topology,
            url=url,
            hosts=hosts,
            tls=tls,
            username=username,
            password=password,
        )
    if not segments or len(segments) > 2:
        raise ValueError(f"{shown_url(url)!r}: give the master's name: …/MASTER or …/MASTER/DB")
    db = _db(segments[1], url) if len(segments) == 2 else 0
    return RedisTarget(
        topology=topology,
        url=url,
        hosts=hosts,
        master=unquote(segments[0]),
        db=db,
        tls=tls,
        username=username,
        password=password,
        sentinel_auth=sentinel_auth,
    )


def _standalone(url: str) -> RedisTarget:
    parts = urlsplit(url)
    path = parts.path.strip("/")
    if parts.scheme != "unix" and path and not path.isdigit():
        raise ValueError(f"{shown_url(url)!r}: database {path!r} must be a number")
    try:
        kwargs = aioredis.connection.parse_url(url)
    except ValueError as err:
        raise ValueError(f"{shown_url(url)!r}: {err}") from None
    db = int(kwargs.get("db") or 0)
    return RedisTarget(topology=Topology.STANDALONE, url=url, db=db)


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    if not userinfo:
        return None, None
    user, colon, password = userinfo.partition(":")
    if not colon:
        return None, unquote(user)  # redis://secret@host: the password alone, as redis-py reads it
    return (unquote(user) or None), unquote(password)


def _hosts(hostlist: str, url: str) -> tuple[tuple[str, int], ...]:
    hosts: list[tuple[str, int]] = []
    for item in hostlist.split(","):
        host, colon, port_text = item.rpartition(":")
        if not item or not colon or not host or host.startswith("[") != host.endswith("]"):
            raise ValueError(f"{shown_url(url)!r}: {item!r} is not HOST:PORT")
        if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
            raise ValueError(f"{shown_url(url)!r}: port {port_text!r} must be 1..65535")
        hosts.append((host.strip("[]"), int(port_text)))
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"{shown_url(url)!r}: a host is listed twice")
    return tuple(hosts)


def _db(text: str, url: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{shown_url(url)!r}: database {text!r} must be a number")
    return int(text)


def _yes_no(text: str, url: str) -> bool:
    if text.lower() in ("yes", "true", "1"):
        return True
    if text.lower() in ("no", "false", "0"):
        return False
    raise ValueError(f"{shown_url(url)!r}: sentinel_auth must be yes or no, got {text!r}")


def shown_url(url: str) -> str:
    """The URL with any password masked, for error messages and logs."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, tail = rest.rpartition("@")
    if not sep or not at or (":" not in userinfo and not userinfo):
        return url
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}://{user + ':' if colon else ''}***@{tail}"


def connect(
    target: RedisTarget, *, timeout_s: float = 1.0, max_connections: int = 256
) -> RedisClient:
    """The client for ``target``, with the edge's connection policy on every topology:

    - at most ``max_connections`` to each server; a burst waits (up to ``timeout_s``) for a
      free connection instead of failing (standalone and Sentinel: a blocking pool; the
      Cluster client caps connections per node);
    - short timeouts, so the breaker and the failure policy take over quickly;
    - one immediate retry on a connection error, so a connection to a server that restarted
      or failed over is replaced rather than failing a request (timeouts are not retried:
      that would only double the wait before the failure policy applies).
    """
    common: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
    }
    if target.topology is Topology.STANDALONE:
        pool = BlockingConnectionPool.from_url(
            target.url, max_connections=max_connections, timeout=timeout_s, **common
        )
        return aioredis.Redis.from_pool(pool)
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.topology is Topology.SENTINEL:
        sentinel_kwargs: dict[str, Any] = {
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "ssl": target.tls,
        }
        if target.sentinel_auth:
            sentinel_kwargs.update(auth)
        sentinel = EpochSentinel(list(target.hosts), sentinel_kwargs=sentinel_kwargs)
        client: aioredis.Redis = sentinel.master_for(
            target.master,
            connection_pool_class=BlockingSentinelPool,
            max_connections=max_connections,
            timeout=timeout_s,
            db=target.db,
            ssl=target.tls,
            **auth,
            **common,
        )
        return client
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.hosts],
        max_connections=max_connections,
        ssl=target.tls,
        **auth,
        **common,
    )


class EpochSentinel(Sentinel):
    """redis-py's Sentinel client, whose discovery never goes back to an older configuration.

    Why: after a failover the sentinels learn the new primary from each other (hello messages,
    every 2 s), and an *ordered* failover leaves the old primary up, answering writes as a
    primary until the sentinels demote it (several seconds later); whatever it takes then is
    lost when it syncs from the new one. redis-py trusts the first sentinel that answers, so a
    connection opened just after the switch could go back to the old primary. Every answer
    carries its configuration's epoch, which grows with each failover: an answer older than
    one already seen is passed over for the next sentinel's. Only when no reachable sentinel
    has caught up is the newest of the older answers used (no primary at all would be worse).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]  # untyped in redis-py
        self.epochs: dict[str, int] = {}
        """The newest configuration epoch seen per master name."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        newest = self.epochs.get(service_name, -1)
        older: list[tuple[int, tuple[str, int]]] = []
        errors: list[str] = []
        for turn, sentinel in enumerate(self.sentinels):
            try:
                masters: dict[str, dict[str, Any]] = await sentinel.sentinel_masters()  # type: ignore[assignment]
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as err:
                errors.append(f"{sentinel} - {err!r}")
                continue
            state = masters.get(service_name)
            if not state or not self.check_master_state(state, service_name):
                continue
            epoch = int(state.get("config-epoch", 0))
            ip = state["ip"] if self._force_master_ip is None else self._force_master_ip
            address = (ip, int(state["port"]))
            if epoch < newest:
                older.append((epoch, address))
                continue
            self.epochs[service_name] = epoch
            # Ask this sentinel first next time (as redis-py does).
            self.sentinels[0], self.sentinels[turn] = sentinel, self.sentinels[0]
            return address
        if older:
            epoch, address = max(older)
            event(
                log,
                "redis.sentinel_behind",
                level=logging.WARNING,
                master=service_name,
                epoch=epoch,
                newest_seen=newest,
                to=address,
            )
            return address
        detail = f" : {', '.join(errors)}" if errors else ""
        raise MasterNotFoundError(f"No master found for {service_name!r}{detail}")


class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """The Sentinel pool with the blocking pool's waiting: at most ``max_connections`` to the
    primary, a burst waits for a free one (redis-py's Sentinel pool would fail it instead).

    A connection handed back while it points at a server that is no longer the primary is
    closed, so its next use reconnects to the primary. redis-py drops only the idle ones when
    it learns of a new primary; one busy at that moment would go back to the pool still bound
    to the old server and, after an ordered failover, write there until the old primary is
    demoted — writes that are then lost.
    """

    async def release(self, connection: AbstractConnection) -> None:
        server = (getattr(connection, "host", None), getattr(connection, "port", None))
        primary = self.master_address
        if self.is_master and primary is not None and connection.is_connected and server != primary:
            event(log, "redis.stale_connection_closed", server=server, primary=primary)
            await connection.disconnect()
        await super().release(connection)


async def open_pubsub(client: RedisClient) -> PubSub:
    """A pub/sub connection of ``client`` that ignores subscribe confirmations. A Cluster
    client reads the slot map first (its pub/sub picks a node by the channel's slot)."""
    if isinstance(client, RedisCluster):
        await client.initialize()
    return client.pubsub(ignore_subscribe_messages=True)


async def close_client(client: RedisClient) -> None:
    """Close ``client`` and everything it opened. A Sentinel-backed client also holds one
    client per sentinel (for discovery and ``+switch-master``) that its own ``aclose`` leaves
    open; they are closed here too."""
    pool = getattr(client, "connection_pool", None)
    await client.aclose()
    if isinstance(pool, SentinelConnectionPool):
        sentinels: list[aioredis.Redis] = pool.sentinel_manager.sentinels
        for one in sentinels:
            await one.aclose()


def primary_of(client: RedisClient) -> Callable[[], object]:
    """A cheap, I/O-free answer to "which server takes our writes now?", to notice a
    failover: the primary's address the Sentinel pool last learned; ``None`` (never changes)
    for one server or a Cluster."""
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        return lambda: pool.master_address
    return lambda: None


async def follow_failovers(client: RedisClient, stop: asyncio.Event) -> None:
    """Until ``stop``: on a Sentinel client, listen to the sentinels' ``+switch-master``
    events and move to the new primary at once, rather than when a connection to the old one
    next fails (after an ordered failover the old primary answers writes until the sentinels
    demote it, and whatever it takes then is lost). Every connection of the pool is dropped
    and reconnects to the new primary. Any other client: returns at once.
    """
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, SentinelConnectionPool):
        return
    sentinels: list[aioredis.Redis] = pool.sentinel_manager.sentinels
    turn = 0
    backoff_s = 0.1
    while not stop.is_set():
        source = sentinels[turn % len(sentinels)]
        pubsub = source.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe("+switch-master")
            backoff_s = 0.1
            while not stop.is_set():
                msg = await pubsub.get_message(timeout=0.5)
                if msg is None or msg.get("type") != "message":
                    continue
                data = msg["data"]
                fields = (data.decode() if isinstance(data, bytes) else str(data)).split()
                if fields and fields[0] == pool.service_name:
                    # Ask the sentinel that announced the switch first: the others may not
                    # have heard of it yet, and its answer's epoch makes theirs stale.
                    at = sentinels.index(source)
                    sentinels[0], sentinels[at] = sentinels[at], sentinels[0]
                    address = await pool.get_master_address()  # type: ignore[no-untyped-call]
                    # Busy connections too: redis-py hands a released connection out again
                    # wherever it points. A command in flight fails over to the new primary
                    # through the one retry on connection errors; pub/sub resubscribes.
                    await pool.disconnect(inuse_connections=True)
                    event(log, "redis.primary_switched", master=pool.service_name, to=address)
        except REDIS_FAILURES as err:
            event(log, "redis.sentinel_unreachable", level=logging.DEBUG, error=type(err).__name__)
            turn += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff_s)
            backoff_s = min(backoff_s * 2, 2.0)
        finally:
            with contextlib.suppress(*REDIS_FAILURES):
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py
