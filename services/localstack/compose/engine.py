"""Which Docker engine the compose tools use, and a private one when the machine has none.

In order: the engine at ``DOCKER_HOST`` (an explicit choice: if it does not answer, that is
the answer); the default socket ``/var/run/docker.sock``; otherwise, when ``dockerd`` is
installed and we are root, a **private engine** started for this run — its own data root,
exec root, socket and pid file under ``state_dir`` (the build folder), no default bridge and
no iptables rules (``--bridge none --iptables=false``: compose makes its own networks, and
the host's firewall and any system engine's state stay untouched) — and stopped afterwards.
Builds then use the host's network (``network_mode=host``), which needs no NAT.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

DEFAULT_SOCKET = Path("/var/run/docker.sock")
#: A unix socket path must fit in sun_path (108 bytes); containerd's lives under the exec root.
_MAX_SOCKET_PATH = 100


class EngineUnavailable(RuntimeError):
    """No Docker engine can be used here; the message says why."""


@dataclass
class PrivateEngine:
    """A dockerd of our own (see the module docstring); ``stop`` ends it."""

    state_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    exec_root: Path = field(init=False)

    def __post_init__(self) -> None:
        self.state_dir = self.state_dir.resolve()
        exec_root = self.state_dir / "exec"
        if len(str(exec_root / "containerd" / "containerd.sock.ttrpc")) > _MAX_SOCKET_PATH:
            # Too deep for a unix socket: a short folder of our own, named after the state dir.
            digest = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:12]
            exec_root = Path("/tmp") / f"meridian-docker-{digest}"
        self.exec_root = exec_root

    @property
    def socket(self) -> Path:
        return self.state_dir / "docker.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout_s: float = 60.0) -> None:
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise EngineUnavailable("dockerd is not installed (Debian: apt-get install docker.io)")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        log = (self.state_dir / "dockerd.log").open("ab")
        self.proc = subprocess.Popen(
            [
                dockerd,
                "--data-root",
                str(self.state_dir / "data"),
                "--exec-root",
                str(self.exec_root),
                "--host",
                self.url,
                "--pidfile",
                str(self.state_dir / "docker.pid"),
                "--bridge",
                "none",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise EngineUnavailable(
                    f"dockerd exited with code {self.proc.returncode}; "
                    f"see {self.state_dir / 'dockerd.log'}"
                )
            if _answers(self.url):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise EngineUnavailable(f"dockerd did not answer within {timeout_s:g}s")
            time.sleep(0.2)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._unmount_leftovers()

    def _unmount_leftovers(self) -> None:
        """dockerd leaves its network namespace's bind mount (exec-root/netns/default)
        behind; without unmounting it the state folder cannot be deleted."""
        roots = (str(self.exec_root), str(self.state_dir))
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            points = [line.split()[1] for line in mounts]
        for point in sorted(points, key=len, reverse=True):
            if point.startswith(roots):
                subprocess.run(["umount", "-l", point], check=False, capture_output=True)


@dataclass
class Engine:
    """A Docker engine that answered: its URL, an SDK client, the private engine if ours."""

    url: str
    client: docker.DockerClient
    private: PrivateEngine | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a child process (the compose binary) needs to reach this engine."""
        return {"DOCKER_HOST": self.url}

    def close(self) -> None:
        self.client.close()
        if self.private is not None:
            self.private.stop()


#: The Engine API version the SDK speaks. Fixed (1.41: Docker 20.10, Debian bookworm's
#: docker.io; every newer engine still serves it) so that building a client sends no request:
#: with "auto" the SDK asks the engine for its version inside the constructor, and when that
#: fails it leaves the socket it opened unclosed.
API_VERSION = "1.41"


def _listening(url: str) -> bool:
    """Whether something accepts connections at ``url`` (unix:// or tcp://), checked with a
    plain socket that is always closed."""
    try:
        if url.startswith("unix://"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(2.0)
                sock.connect(url.removeprefix("unix://"))
        else:
            host, _, port = url.split("://", 1)[-1].rpartition(":")
            socket.create_connection((host, int(port)), timeout=2.0).close()
    except (OSError, ValueError):
        return False
    return True


def client_for(url: str, *, timeout_s: int) -> docker.DockerClient:
    return docker.DockerClient(base_url=url, version=API_VERSION, timeout=timeout_s)


def _answers(url: str) -> bool:
    if not _listening(url):
        return False
    try:
        client = client_for(url, timeout_s=5)
    except docker.errors.DockerException:
        return False
    try:
        return bool(client.ping())
    except (docker.errors.DockerException, OSError):
        return False
    finally:
        client.close()


def find_engine(*, state_dir: Path, allow_private: bool = True) -> Engine:
    """The engine to use (see the module docstring); raises EngineUnavailable saying why."""
    url = os.environ.get("DOCKER_HOST")
    if url:
        if not _answers(url):
            raise EngineUnavailable(f"DOCKER_HOST={url} does not answer")
        return Engine(url, client_for(url, timeout_s=600))
    default = f"unix://{DEFAULT_SOCKET}"
    if DEFAULT_SOCKET.exists() and _answers(default):
        return Engine(default, client_for(default, timeout_s=600))
    if not allow_private:
        raise EngineUnavailable("no Docker engine (DOCKER_HOST unset, no /var/run/docker.sock)")
    if shutil.which("dockerd") is None:
        raise EngineUnavailable(
            "no Docker engine: DOCKER_HOST is unset, /var/run/docker.sock does not answer, "
            "and dockerd is not installed (Debian: apt-get install docker.io)"
        )
    if os.geteuid() != 0:
        raise EngineUnavailable(
            "no Docker engine: DOCKER_HOST is unset, /var/run/docker.sock does not answer, "
            "and a private dockerd needs root"
        )
    private = PrivateEngine(state_dir)
    private.start()
    return Engine(private.url, client_for(private.url, timeout_s=600), private)
