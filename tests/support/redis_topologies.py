"""Real Redis topologies for tests: Sentinel (a primary, replicas, three sentinels) and Cluster
(three primaries, every slot assigned), all ``redis-server`` processes of the tests' own on free
ports of 127.0.0.1 — never the machine's shared 6379.

Both are started the way an operator would: replicas with ``--replicaof``, sentinels with
``redis-server FILE --sentinel`` (each from its own config file: sentinels rewrite it), the
cluster with ``cluster-enabled yes`` nodes joined by ``redis-cli --cluster create``.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from services.common.net import free_port

MASTER_NAME = "meridian"


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is required for the Redis topology tests")
    return path


def _wait_ping(port: int, timeout_s: float = 10.0) -> None:
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                if client.ping():
                    return
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
    finally:
        client.close()


@dataclass
class _Server:
    """One redis-server process (data node or sentinel)."""

    port: int
    args: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)
        _wait_ping(self.port)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _data_args(port: int, workdir: Path, *extra: str) -> list[str]:
    return [
        _binary("redis-server"),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(workdir),
        *extra,
    ]


@dataclass
class SentinelTopology:
    """A primary, ``replicas`` replicas and three sentinels watching them (quorum 2)."""

    workdir: Path
    replicas: int = 2
    down_after_ms: int = 1000
    failover_timeout_ms: int = 3000
    nodes: list[_Server] = field(default_factory=list)
    sentinels: list[_Server] = field(default_factory=list)

    def start(self) -> None:
        """Start everything, or stop what did start and raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        primary_port = free_port()
        for i in range(1 + self.replicas):
            port = primary_port if i == 0 else free_port()
            node_dir = self.workdir / f"node-{port}"
            node_dir.mkdir()
            # No 5 s pause before the first (diskless) sync: a replica that has not synced
            # yet would be promoted empty.
            extra = ["--repl-diskless-sync-delay", "0"]
            if i > 0:
                extra += ["--replicaof", "127.0.0.1", str(primary_port)]
            server = _Server(port, _data_args(port, node_dir, *extra), node_dir / "log")
            server.start()
            self.nodes.append(server)
        for _ in range(3):
            port = free_port()
            conf = self.workdir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
                f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n"
            )
            args = [_binary("redis-server"), str(conf), "--sentinel"]
            server = _Server(port, args, self.workdir / f"sentinel-{port}.log")
            server.start()
            self.sentinels.append(server)
        self.wait_until_replicas_synced()
        self.wait_until_replicas_known()

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def primary_port(self) -> int:
        """The primary as the sentinels see it now."""
        client = redis.Redis(host="127.0.0.1", port=self.sentinels[0].port)
        try:
            addr = client.sentinel_get_master_addr_by_name(MASTER_NAME)
            assert isinstance(addr, tuple), addr
            _, port = addr
        finally:
            client.close()
        return int(port)

    def order_failover(self) -> None:
        """SENTINEL FAILOVER: promote a replica now; the old primary becomes a replica."""
        client = redis.Redis(host="127.0.0.1", port=self.sentinels[0].port)
        try:
            client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def node(self, port: int) -> _Server:
        return next(n for n in self.nodes if n.port == port)

    def wait_until_replicas_synced(self, timeout_s: float = 20.0) -> None:
        """Every replica has finished its first sync (its link to the primary is up)."""
        deadline = time.monotonic() + timeout_s
        for node in self.nodes[1:]:
            client = redis.Redis(host="127.0.0.1", port=node.port)
            try:
                while client.info("replication").get("master_link_status") != "up":
                    if time.monotonic() > deadline:
                        raise TimeoutError("a replica did not sync with the primary")
                    time.sleep(0.05)
            finally:
                client.close()

    def wait_until_replicas_known(self, timeout_s: float = 20.0) -> None:
        """Every sentinel knows the primary's replicas (needed before a failover can run)."""
        deadline = time.monotonic() + timeout_s
        for sentinel in self.sentinels:
            client = redis.Redis(host="127.0.0.1", port=sentinel.port)
            try:
                while len(client.sentinel_slaves(MASTER_NAME)) < self.replicas:
                    if time.monotonic() > deadline:
                        raise TimeoutError("sentinels did not discover the replicas")
                    time.sleep(0.1)
            finally:
                client.close()

    def wait_for_new_primary(self, old_port: int, timeout_s: float = 30.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port != old_port:
                probe = redis.Redis(host="127.0.0.1", port=port)
                try:
                    if probe.info("replication")["role"] == "master":
                        return port
                except redis.exceptions.ConnectionError:
                    pass
                finally:
                    probe.close()
            time.sleep(0.05)
        raise TimeoutError("no failover within the deadline")

    def stop(self) -> None:
        for server in [*self.sentinels, *self.nodes]:
            server.stop()


@dataclass
class ClusterTopology:
    """Three primaries (no replicas), all 16384 slots assigned, joined by redis-cli."""

    workdir: Path
    primaries: int = 3
    nodes: list[_Server] = field(default_factory=list)

    def start(self) -> None:
        """Start everything, or stop what did start and raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for _ in range(self.primaries):
            port = free_port()
            node_dir = self.workdir / f"node-{port}"
            node_dir.mkdir()
            extra = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(node_dir / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
                # The bus port, chosen too: the default (port + 10000) may be taken or > 65535.
                "--cluster-port",
                str(free_port()),
            ]
            server = _Server(port, _data_args(port, node_dir, *extra), node_dir / "log")
            server.start()
            self.nodes.append(server)
        subprocess.run(
            [
                _binary("redis-cli"),
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self._wait_ok()

    def _wait_ok(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            client = redis.Redis(host="127.0.0.1", port=node.port)
            try:
                while client.cluster("INFO").get("cluster_state") != "ok":
                    if time.monotonic() > deadline:
                        raise TimeoutError("the cluster did not reach state ok")
                    time.sleep(0.05)
            finally:
                client.close()

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def flush(self) -> None:
        for node in self.nodes:
            client = redis.Redis(host="127.0.0.1", port=node.port)
            try:
                client.flushall()
            finally:
                client.close()

    def stop(self) -> None:
        for server in self.nodes:
            server.stop()


@dataclass
class LoneSentinel:
    """One data node and one sentinel that believes it is ``MASTER_NAME``'s primary at
    configuration epoch ``epoch``: two of these with different epochs are what a client sees
    while sentinels disagree just after a failover (one has heard of it, one has not)."""

    workdir: Path
    epoch: int
    node: _Server | None = None
    sentinel: _Server | None = None

    def start(self) -> None:
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            port = free_port()
            node_dir = self.workdir / f"node-{port}"
            node_dir.mkdir()
            self.node = _Server(port, _data_args(port, node_dir), node_dir / "log")
            self.node.start()
            sentinel_port = free_port()
            conf = self.workdir / f"sentinel-{sentinel_port}.conf"
            conf.write_text(
                f"port {sentinel_port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {port} 1\n"
                f"sentinel config-epoch {MASTER_NAME} {self.epoch}\n"
            )
            args = [_binary("redis-server"), str(conf), "--sentinel"]
            self.sentinel = _Server(sentinel_port, args, self.workdir / "sentinel.log")
            self.sentinel.start()
            self._wait_until_master_known()
        except BaseException:
            self.stop()
            raise

    def _wait_until_master_known(self, timeout_s: float = 10.0) -> None:
        """The sentinel has connected to the node and sees it as a primary."""
        client = redis.Redis(host="127.0.0.1", port=self.sentinel_port)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                state = client.sentinel_master(MASTER_NAME)
                assert isinstance(state, dict), state
                if state.get("is_master") and not state.get("is_sdown"):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the sentinel does not see its primary: {state}")
                time.sleep(0.05)
        finally:
            client.close()

    @property
    def port(self) -> int:
        assert self.node is not None
        return self.node.port

    @property
    def sentinel_port(self) -> int:
        assert self.sentinel is not None
        return self.sentinel.port

    def stop(self) -> None:
        for server in (self.sentinel, self.node):
            if server is not None:
                server.stop()
