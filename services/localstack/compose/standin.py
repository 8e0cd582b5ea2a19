"""Base images without a registry: stand-ins built from Debian's packages.

The Dockerfile and compose file name public images (``python:3.11-slim``, ``redis:7-alpine``).
Where those cannot be pulled (no route to the registries), each is replaced by a stand-in
with the same tag, so the unchanged files build and run:

- ``python:3.11-slim`` — Debian bookworm (minbase) with ``python3`` 3.11 and ``python3-venv``
  (what the Dockerfile uses: ``python3 -m venv``);
- ``redis:7-alpine`` — Debian bookworm with ``redis-server`` 7 and ``redis-cli``.

Each is made with ``debootstrap`` from the same Debian mirror the machine uses, with the
machine's CA bundle copied in (``/etc/ssl/certs/ca-certificates.crt``) and ``PIP_CERT`` /
``SSL_CERT_FILE`` pointing at it, so ``pip`` works behind a TLS-intercepting proxy. The root
file system is kept as a tarball in ``cache_dir`` (``~/.cache/meridian/standin``), keyed by
the recipe, the mirror and the CA bundle: later runs on the same machine import it in seconds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from services.common.logs import event

log = logging.getLogger("meridian.localstack.compose")

CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
_TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man")


@dataclass(frozen=True, slots=True)
class StandIn:
    tag: str  # the public image it stands in for
    packages: tuple[str, ...]
    changes: tuple[str, ...]  # Dockerfile instructions applied on import

    def key(self, mirror: str, ca_bundle: bytes) -> str:
        recipe = json.dumps([SUITE, mirror, self.packages, self.changes, _TRIM])
        return hashlib.sha256(recipe.encode() + ca_bundle).hexdigest()[:16]


_CA_ENV = (
    f"ENV PIP_CERT={CA_BUNDLE}",
    f"ENV SSL_CERT_FILE={CA_BUNDLE}",
    f"ENV REQUESTS_CA_BUNDLE={CA_BUNDLE}",
)
STANDINS: dict[str, StandIn] = {
    "python:3.11-slim": StandIn(
        "python:3.11-slim",
        ("python3", "python3-venv"),
        (*_CA_ENV, "ENV LANG=C.UTF-8", 'CMD ["python3"]'),
    ),
    "redis:7-alpine": StandIn(
        "redis:7-alpine",
        ("redis-server",),
        (*_CA_ENV, "WORKDIR /var/lib/redis", "USER redis", 'CMD ["redis-server"]'),
    ),
}


def default_cache_dir() -> Path:
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "meridian" / "standin"


def ensure_base_images(
    client: docker.DockerClient,
    tags: Sequence[str],
    *,
    cache_dir: Path,
    mirror: str = DEFAULT_MIRROR,
    pull: Callable[[str], bool] | None = None,
) -> dict[str, str]:
    """Make every tag in ``tags`` present; returns how each got there: ``present``,
    ``pulled``, ``stand-in (cached)`` or ``stand-in (built)``. Raises RuntimeError with the
    reason when a tag can be neither pulled nor stood in for."""
    how: dict[str, str] = {}
    pull = pull or (lambda tag: _pull(client, tag))
    for tag in tags:
        if _present(client, tag):
            how[tag] = "present"
        elif pull(tag):
            how[tag] = "pulled"
        elif tag in STANDINS:
            how[tag] = _stand_in(client, STANDINS[tag], cache_dir=cache_dir, mirror=mirror)
        else:
            raise RuntimeError(f"{tag}: cannot be pulled and has no stand-in")
        event(log, "compose.base_image", image=tag, how=how[tag])
    return how


def _present(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _pull(client: docker.DockerClient, tag: str) -> bool:
    repository, _, version = tag.partition(":")
    try:
        client.images.pull(repository, tag=version or "latest")
    except (docker.errors.APIError, docker.errors.DockerException):
        return False
    return True


def _stand_in(client: docker.DockerClient, recipe: StandIn, *, cache_dir: Path, mirror: str) -> str:
    ca = CA_BUNDLE.read_bytes() if CA_BUNDLE.exists() else b""
    key = recipe.key(mirror, ca)
    name = recipe.tag.replace(":", "-").replace("/", "-")
    tarball = cache_dir / f"{name}-{key}.tar"
    how = "stand-in (cached)"
    if not tarball.exists():
        _build_rootfs(recipe, tarball, mirror=mirror, ca=ca)
        how = "stand-in (built)"
    repository, _, version = recipe.tag.partition(":")
    client.api.import_image(
        src=str(tarball),
        repository=repository,
        tag=version,
        changes=[*recipe.changes, f"LABEL org.meridian.standin={key}"],
    )
    return how


def _build_rootfs(recipe: StandIn, tarball: Path, *, mirror: str, ca: bytes) -> None:
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(debootstrap).exists():
        raise RuntimeError(
            f"{recipe.tag}: cannot be pulled, and debootstrap (to build a stand-in from "
            "Debian packages) is not installed: apt-get install debootstrap"
        )
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="meridian-standin-") as tmp:
        root = Path(tmp) / "rootfs"
        event(log, "compose.standin_building", image=recipe.tag, packages=list(recipe.packages))
        subprocess.run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(recipe.packages)}",
                SUITE,
                str(root),
                mirror,
            ],
            check=True,
            capture_output=True,
            timeout=1800,
        )
        for rel in _TRIM:
            target = root / rel
            if target.is_dir():
                for child in target.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        bundle = root / CA_BUNDLE.relative_to("/")
        bundle.parent.mkdir(parents=True, exist_ok=True)
        bundle.unlink(missing_ok=True)
        bundle.write_bytes(ca)
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.rename(tarball)  # complete or absent: a run killed half-way leaves no cache
