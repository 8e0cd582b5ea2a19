"""Start, watch and stop the whole local multi-region stack as real processes.

Order (each waits for the previous to be ready): Redis → workers → the network emulator
(one delay route per worker, RTT of its region) → router (watching the *proxied* worker
addresses, so it measures the distance) → demo API key → edge. Stop runs in reverse: the edge
drains first, so no new request finds a worker gone.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from redis.asyncio.sentinel import MasterNotFoundError

from services.common.clock import SYSTEM_CLOCK
from services.common.net import redact_url
from services.edge.redisconn import REDIS_FAILURES, RedisClient, connect, parse_redis_url
from services.edge.selfsigned import write_self_signed
from services.edge.tenancy.apikeys import KeyHasher, load_pepper, new_pepper
from services.edge.tenancy.directory import Directory
from services.edge.tenancy.tenants import Tenant
from services.localstack.config import StackConfig
from services.localstack.procs import ManagedProcess, ProcessFailed
from services.localstack.redis_server import RedisServer

REPO_ROOT = Path(__file__).resolve().parents[2]
_WITH_METRICS = ("services.edge", "services.router", "services.worker")
_SERVICE_KINDS = {
    "services.edge": "edge",
    "services.router": "router",
    "services.worker": "worker",
    "services.netem": "netem",
}


@dataclass(frozen=True, slots=True)
class WorkerEndpoint:
    name: str
    region: str
    direct: str  # host:port of the worker itself
    proxied: str  # host:port through the delay proxy (what router and edge dial)


@dataclass(slots=True)
class StackEndpoints:
    edge_url: str = ""
    router: str = ""
    redis_url: str = ""
    demo_key: str = ""
    admin_url: str = ""
    tls_cert: str = ""  # the self-signed certificate clients must trust (tls=True only)
    grpc_tls_ca: str = ""  # the CA of the services' mutual TLS (grpc_tls=True only)
    model: str = ""
    router_debug_url: str = ""
    workers: dict[str, WorkerEndpoint] = field(default_factory=dict)
    # Prometheus endpoints by process name (edge, router, each worker).
    metrics: dict[str, str] = field(default_factory=dict)


class LocalStack:
    def __init__(
        self,
        *,
        config: StackConfig,
        run_dir: Path,
        engine: str = "sim",
        edge_port: int = 8080,
        redis_url: str | None = None,
        vllm_model_path: Path | None = None,
        vllm_embedding_model_path: Path | None = None,
        router_profile: Path | None = None,
        log_level: str = "info",
        python: str = sys.executable,
        tls: bool = False,
        grpc_tls: bool = False,
        edge_args: Sequence[str] = (),
        edge_workers: int = 1,
        service_env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.engine = engine
        self.edge_port = edge_port
        self._redis_url = redis_url
        self._vllm_model_path = vllm_model_path
        self._vllm_embedding_model_path = vllm_embedding_model_path
        self._router_profile = router_profile
        self._log_level = log_level
        self._python = python
        self.tls = tls
        #: Mutual TLS between the services, with a development CA written into run_dir.
        self.grpc_tls = grpc_tls
        self._grpc_tls_flags: dict[str, list[str]] = {}
        self._edge_args = tuple(edge_args)  # extra edge flags (benchmarks lift per-IP limits)
        self.edge_workers = edge_workers  # edge processes on the one port (--workers)
        # Extra environment by kind of service ("edge", "router", "worker", "netem"), on top of
        # this process's: benchmarks set telemetry per service.
        unknown = set(service_env or {}) - set(_SERVICE_KINDS.values())
        if unknown:
            raise ValueError(f"service_env: no such service kind {sorted(unknown)}")
        self._service_env = {k: dict(v) for k, v in (service_env or {}).items()}
        self.redis: RedisServer | None = None
        self.workers: dict[str, ManagedProcess] = {}
        self.netem: ManagedProcess | None = None
        self.router: ManagedProcess | None = None
        self.edge: ManagedProcess | None = None
        self.endpoints = StackEndpoints(model=config.served_model(engine))

    def _proc(self, name: str, module: str, *args: str) -> ManagedProcess:
        ready = self.run_dir / f"{name}.ready"
        if module in _WITH_METRICS:
            args = (*args, "--metrics-port", "0")
        args = (*args, *self._grpc_tls_flags.get(_SERVICE_KINDS[module], ()))
        return ManagedProcess(
            name=name,
            argv=[self._python, "-m", module, "--ready-file", str(ready), *args],
            log_path=self.run_dir / "logs" / f"{name}.log",
            ready_file=ready,
            env=self._service_env.get(_SERVICE_KINDS[module]),
        )

    def processes(self) -> list[ManagedProcess]:
        procs = [self.redis.process] if self.redis else []
        procs += list(self.workers.values())
        procs += [p for p in (self.netem, self.router, self.edge) if p is not None]
        return procs

    async def start(self) -> StackEndpoints:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not self._worker_plan():
            where = "vllm.regions" if self.engine == "vllm" else "regions.<name>.workers"
            raise ProcessFailed(
                f"the stack config starts no {self.engine} worker: give at least one ({where})"
            )
        if self.grpc_tls:
            self._write_grpc_certificates()
        try:
            await self._start_redis()
            await self._start_workers()
            await self._start_netem()
            await self._start_router()
            await self._create_demo_key()
            await self._start_edge()
            await self._wait_edge_ready()
        except BaseException:
            await self.stop()
            raise
        for proc in self.processes():
            port = proc.ready_info.get("metrics_port")
            if port:
                self.endpoints.metrics[proc.name] = f"http://127.0.0.1:{port}/metrics"
            # An edge of several processes: each has its own metrics (edge, edge-1, ...).
            for i, child in enumerate(proc.ready_info.get("processes", [])[1:], start=1):
                if child.get("metrics_port"):
                    self.endpoints.metrics[f"{proc.name}-{i}"] = (
                        f"http://127.0.0.1:{child['metrics_port']}/metrics"
                    )
        return self.endpoints

    def _write_grpc_certificates(self) -> None:
        """A fresh development CA and one certificate per kind of service (each run: no key
        outlives the stack that used it)."""
        from services.common.devca import write_dev_ca

        kinds = ("edge", "router", "worker")
        issued = write_dev_ca(self.run_dir / "grpc-tls", names=kinds, hosts=("127.0.0.1",))
        for kind, files in issued.items():
            self._grpc_tls_flags[kind] = [
                "--grpc-tls-cert",
                str(files.cert),
                "--grpc-tls-key",
                str(files.key),
                "--grpc-tls-ca",
                str(files.ca),
            ]
        self.endpoints.grpc_tls_ca = str(issued["edge"].ca)

    async def _start_redis(self) -> None:
        if self._redis_url:
            await _check_redis(self._redis_url)
            self.endpoints.redis_url = self._redis_url
            return
        self.redis = RedisServer(run_dir=self.run_dir / "redis")
        await self.redis.start()
        self.endpoints.redis_url = self.redis.url

    def _worker_plan(self) -> list[tuple[str, str, str]]:
        """(name, region, engine) for every worker to start."""
        plan = []
        if self.engine == "vllm":
            for region, count in self.config.vllm_regions.items():
                plan += [(f"{region}-vllm-{i + 1}", region, "vllm") for i in range(count)]
            if self._vllm_embedding_model_path is not None:
                for region, count in self.config.vllm_embedding_regions.items():
                    plan += [
                        (f"{region}-vllm-embed-{i + 1}", region, "vllm-embed") for i in range(count)
                    ]
        else:
            for spec in self.config.regions:
                plan += [(f"{spec.name}-{i + 1}", spec.name, "sim") for i in range(spec.workers)]
        return plan

    async def _start_workers(self) -> None:
        sim_file = self.run_dir / "sim.yaml"
        if self.config.sim:
            import yaml

            sim_file.write_text(yaml.safe_dump(self.config.sim))
        for name, region, engine in self._worker_plan():
            args = [
                "--worker-id",
                name,
                "--region",
                region,
                "--engine",
                engine,
                "--log-level",
                self._log_level,
            ]
            if engine == "sim":
                args += ["--model", self.config.model]
                if self.config.sim:
                    args += ["--sim-config", str(sim_file)]
            elif engine == "vllm-embed":
                assert self._vllm_embedding_model_path is not None
                args[args.index("vllm-embed")] = "vllm"
                args += [
                    "--model",
                    str(self._vllm_embedding_model_path),
                    "--served-model-name",
                    self.config.vllm_embedding_model,
                    "--runner",
                    "pooling",
                ]
                for key, value in self.config.vllm_options.items():
                    flag = "--" + key.replace("_", "-")
                    args += [flag] if value is True else [flag, str(value)]
            else:
                assert self._vllm_model_path is not None
                args += [
                    "--model",
                    str(self._vllm_model_path),
                    "--served-model-name",
                    self.config.vllm_model,
                ]
                for key, value in self.config.vllm_options.items():
                    flag = "--" + key.replace("_", "-")
                    args += [flag] if value is True else [flag, str(value)]
            self.workers[name] = self._proc(name, "services.worker", *args)
        for proc in self.workers.values():
            await proc.start()
        # A vLLM worker imports vllm (seconds, more on a busy 2-core host) before it listens.
        listen_timeout_s = 120.0 if self.engine == "vllm" else 30.0
        for name, proc in self.workers.items():
            info = await proc.wait_ready(listen_timeout_s)
            region = name.split("-")[0]
            direct = f"127.0.0.1:{info['port']}"
            self.endpoints.workers[name] = WorkerEndpoint(name, region, direct, direct)

    async def _start_netem(self) -> None:
        """A delay route per worker in a region with distance; a region at 0 ms is dialled
        directly (no proxy hop to measure in benchmarks of Meridian's own overhead)."""
        regions = {r.name: r for r in self.config.regions}
        routes = []
        for name, ep in self.endpoints.workers.items():
            spec = regions[ep.region]
            if spec.rtt_ms == 0 and spec.jitter_ms == 0:
                continue
            route = f"{name}:127.0.0.1:0={ep.direct},delay_ms={spec.rtt_ms / 2:g}"
            if spec.jitter_ms:
                route += f",jitter_ms={spec.jitter_ms:g}"
            routes += ["--route", route]
        if not routes:
            return
        self.netem = self._proc("netem", "services.netem", *routes, "--log-level", self._log_level)
        await self.netem.start()
        info = await self.netem.wait_ready(10.0)
        for name, ep in list(self.endpoints.workers.items()):
            if name not in info["routes"]:
                continue
            port = info["routes"][name]["port"]
            self.endpoints.workers[name] = WorkerEndpoint(
                ep.name, ep.region, ep.direct, f"127.0.0.1:{port}"
            )

    async def _start_router(self) -> None:
        args = ["--site", self.config.site, "--log-level", self._log_level, "--debug-port", "0"]
        for ep in self.endpoints.workers.values():
            args += ["--worker", ep.proxied]
        if self._router_profile is not None:
            args += ["--profile", str(self._router_profile)]
        self.router = self._proc("router", "services.router", *args)
        await self.router.start()
        info = await self.router.wait_ready(15.0)
        self.endpoints.router = f"127.0.0.1:{info['port']}"
        if info.get("debug_port"):
            self.endpoints.router_debug_url = f"http://127.0.0.1:{info['debug_port']}"

    def _secret(self, name: str, make: Callable[[], str]) -> Path:
        """A secret in run_dir/secrets (0600), created once and kept across restarts."""
        folder = self.run_dir / "secrets"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = folder / name
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(make() + "\n")
        return path

    async def _create_demo_key(self) -> None:
        """The demo tenant (standard tier, no limits) and a fresh key for it."""
        hasher = KeyHasher(load_pepper(file=self._secret("key-pepper", new_pepper)))
        client = _redis_client(self.endpoints.redis_url)
        try:
            directory = Directory(redis=client, hasher=hasher, clock=SYSTEM_CLOCK)
            await directory.ensure_tenant(Tenant(tenant_id="demo"))
            raw, _ = await directory.create_key("demo", name="make run demo key")
        finally:
            await client.aclose()
        self.endpoints.demo_key = raw

    async def _start_edge(self) -> None:
        args = [
            "--port",
            str(self.edge_port),
            "--redis-url",
            self.endpoints.redis_url,
            "--router",
            self.endpoints.router,
            "--site",
            self.config.site,
            "--log-level",
            self._log_level,
            "--key-pepper-file",
            str(self._secret("key-pepper", new_pepper)),
            "--admin-port",
            "0",
            "--admin-token-file",
            str(self._secret("admin-token", new_pepper)),
            *(arg for place in self.config.map_places() for arg in ("--map-place", place)),
            *self._edge_args,
        ]
        if self.edge_workers > 1:
            args += ["--workers", str(self.edge_workers)]
        if self.tls:
            cert, key = self.run_dir / "tls" / "edge.crt", self.run_dir / "tls" / "edge.key"
            write_self_signed(cert, key)
            args += ["--tls-cert", str(cert), "--tls-key", str(key)]
            self.endpoints.tls_cert = str(cert)
        else:
            args.append("--plain-http")
        self.edge = self._proc("edge", "services.edge", *args)
        await self.edge.start()
        info = await self.edge.wait_ready(15.0)
        self.endpoints.edge_url = f"{info.get('scheme', 'http')}://127.0.0.1:{info['port']}"
        self.endpoints.admin_url = f"http://127.0.0.1:{info['admin_port']}"

    def _expected_models(self) -> set[str]:
        """Every model some worker of this stack serves once loaded."""
        models = {self.config.served_model(self.engine)}
        embedding = self._vllm_embedding_model_path is not None and any(
            self.config.vllm_embedding_regions.values()
        )
        if self.engine == "vllm" and embedding:
            models.add(self.config.vllm_embedding_model)
        return models

    async def _all_models_listed(self, session: aiohttp.ClientSession) -> bool:
        headers = {"Authorization": f"Bearer {self.endpoints.demo_key}"}
        async with session.get(f"{self.endpoints.edge_url}/v1/models", headers=headers) as resp:
            if resp.status != 200:
                return False
            listed = {m.get("id") for m in (await resp.json()).get("data", [])}
        return self._expected_models() <= listed

    async def _wait_edge_ready(self, timeout_s: float = 300.0) -> None:
        """Until /readyz says the router sees a servable model and every model of the stack is
        listed (vLLM workers take a while to load, each at its own pace)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        connector = None
        if self.endpoints.tls_cert:
            trust = ssl.create_default_context(cafile=self.endpoints.tls_cert)
            connector = aiohttp.TCPConnector(ssl=trust)
        async with aiohttp.ClientSession(connector=connector) as session:
            while True:
                for proc in self.processes():
                    if not proc.alive():
                        raise ProcessFailed(f"{proc.name} exited:\n{proc.log_tail()}")
                try:
                    async with session.get(f"{self.endpoints.edge_url}/readyz") as resp:
                        ready = resp.status == 200
                    if ready and await self._all_models_listed(session):
                        return
                except aiohttp.ClientError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise ProcessFailed("the stack did not become ready in time")
                await asyncio.sleep(0.1)

    async def stop(self) -> None:
        """Reverse order; each process gets SIGTERM and time to drain, then SIGKILL."""
        for proc in (self.edge, self.router, self.netem):
            if proc is not None:
                await proc.stop(grace_s=15.0)
        await asyncio.gather(*(p.stop(grace_s=15.0) for p in self.workers.values()))
        if self.redis is not None:
            await self.redis.stop()


def _redis_client(url: str, timeout_s: float = 5.0) -> RedisClient:
    """A client for ``url`` as the edge makes it: standalone, Sentinel or Cluster URLs alike
    (redis-py's ``from_url`` knows only the first), every bad URL a one-line error."""
    try:
        target = parse_redis_url(url)
    except ValueError as err:
        raise ProcessFailed(f"REDIS_URL {err}") from None
    return connect(target, timeout_s=timeout_s)


async def _check_redis(url: str) -> None:
    """A ``REDIS_URL`` the user gave must answer before anything starts on it."""
    client = _redis_client(url)
    try:
        await client.ping()
    except MasterNotFoundError:  # its message is the repr of every sentinel's pool
        raise ProcessFailed(
            f"REDIS_URL {redact_url(url)} does not answer: no sentinel answered, or none "
            "knows that master's name"
        ) from None
    except REDIS_FAILURES as err:
        raise ProcessFailed(f"REDIS_URL {redact_url(url)} does not answer: {err}") from None
    finally:
        await client.aclose()
