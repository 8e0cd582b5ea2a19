"""DNS discovery: a name that resolves to several workers, re-resolved periodically.

    --worker-dns workers.kr.svc.cluster.local:7000     (Kubernetes headless Service)
    --worker-dns worker:7000                            (docker compose, ``--scale worker=3``)

Each name is resolved with the event loop's ``getaddrinfo`` (the system resolver, in a thread:
it honours /etc/hosts, search domains and the cluster DNS) every ``interval_s``; every address
it returns, with the given port, is a worker to watch. Scaling a Deployment or a compose
service up shows up at the next resolution; a pod that goes away drops out of the answer.

Failures are told apart, because they mean different things:

- the name exists but has no addresses (``EAI_NONAME``/``EAI_NODATA``: a headless Service
  with no ready pod) → the name lists nothing, its workers leave the view;
- anything else (a resolver timeout, ``EAI_AGAIN``) → the last answer is kept: a DNS hiccup
  must not empty the router's view. Health does not wait for DNS either way: a dead worker is
  marked down by its watcher within a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from services.common.logs import event
from services.common.net import parse_address
from services.router.discovery.membership import Membership

log = logging.getLogger("meridian.router.discovery")


class ResolveError(Exception):
    """A resolution that failed for now (timeout, temporary resolver failure)."""


class NameNotFound(ResolveError):
    """The name resolves to no address at all (authoritative: the set is empty)."""


@dataclass(frozen=True, slots=True)
class DnsTarget:
    """A DNS name and the port its workers listen on."""

    host: str
    port: int

    @classmethod
    def parse(cls, value: str) -> DnsTarget:
        """``NAME:PORT`` (an IP literal works too and resolves to itself)."""
        host, _, port = parse_address(value).rpartition(":")
        if any(len(label) > 63 for label in host.split(".")):
            raise ValueError(f"{value!r}: a DNS label is longer than 63 characters")
        return cls(host.strip("[]"), int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def format_address(ip: str, port: int) -> str:
    """``ip:port``, with IPv6 in brackets (as gRPC targets want it)."""
    v6 = ipaddress.ip_address(ip.split("%")[0]).version == 6
    return f"[{ip}]:{port}" if v6 else f"{ip}:{port}"


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> list[str]:
        """Every ``ip:port`` the name leads to, sorted. Raises :class:`NameNotFound` when it
        has none, :class:`ResolveError` when resolution failed for now."""
        ...


class SystemResolver:
    """The system resolver through ``loop.getaddrinfo``, bounded by ``timeout_s``.

    ``family``: ``socket.AF_UNSPEC`` (default: IPv4 and IPv6), or ``AF_INET``/``AF_INET6`` to
    keep one.
    """

    def __init__(self, *, timeout_s: float = 2.0, family: int = socket.AF_UNSPEC) -> None:
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError("timeout_s must be > 0")
        self._timeout_s = timeout_s
        self._family = family

    async def resolve(self, host: str, port: int) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, family=self._family, type=socket.SOCK_STREAM, proto=0),
                self._timeout_s,
            )
        except TimeoutError:
            raise ResolveError(f"{host}: no answer within {self._timeout_s:g}s") from None
        except socket.gaierror as err:
            if err.errno in _NO_ADDRESS:
                raise NameNotFound(f"{host}: {err.strerror}") from None
            raise ResolveError(f"{host}: {err.strerror}") from None
        except (OSError, UnicodeError) as err:  # e.g. a name IDNA cannot encode
            raise ResolveError(f"{host}: {err}") from None
        out = {format_address(str(sockaddr[0]), port) for *_, sockaddr in infos}
        if not out:
            raise NameNotFound(f"{host}: no address")
        return sorted(out)


_NO_ADDRESS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


class DnsDiscovery:
    """Resolves each target every ``interval_s`` and tells :class:`Membership` (one source per
    name, ``dns:NAME:PORT``)."""

    def __init__(
        self,
        *,
        targets: Sequence[DnsTarget],
        membership: Membership,
        resolver: Resolver | None = None,
        interval_s: float = 5.0,
    ) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError("interval_s must be > 0")
        self._targets = tuple(dict.fromkeys(targets))
        self._membership = membership
        self._resolver = resolver or SystemResolver()
        self._interval_s = interval_s
        self._last: dict[DnsTarget, tuple[str, ...]] = {}
        self._failing: set[DnsTarget] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._targets:
            self._task = asyncio.create_task(self._run(), name="dns discovery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def refresh(self) -> None:
        """Resolve every target once (concurrently) and update membership."""
        await asyncio.gather(*(self._refresh_one(t) for t in self._targets))

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._interval_s)

    async def _refresh_one(self, target: DnsTarget) -> None:
        try:
            addresses = tuple(await self._resolver.resolve(target.host, target.port))
        except NameNotFound as err:
            addresses = ()
            self._note_failure(target, str(err), kept=False)
        except ResolveError as err:
            self._note_failure(target, str(err), kept=True)
            return
        else:
            if target in self._failing:
                self._failing.discard(target)
                event(log, "discovery.dns_recovered", target=str(target))
        if self._last.get(target) != addresses:
            event(log, "discovery.dns_changed", target=str(target), addresses=list(addresses))
            self._last[target] = addresses
        self._membership.update(f"dns:{target}", addresses)

    def _note_failure(self, target: DnsTarget, reason: str, *, kept: bool) -> None:
        first = target not in self._failing
        self._failing.add(target)
        event(
            log,
            "discovery.dns_failed",
            level=logging.WARNING if first else logging.DEBUG,
            target=str(target),
            reason=reason,
            kept_last_answer=kept,
        )
