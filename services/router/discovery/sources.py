"""How the router finds workers: every configured source feeds one :class:`Membership`.

| source        | flag                       | fits                                            |
|---------------|----------------------------|-------------------------------------------------|
| static list   | ``--worker HOST:PORT``     | the local stack, fixed docker-compose services  |
| DNS           | ``--worker-dns NAME:PORT`` | Kubernetes headless Services, compose --scale   |
| announcements | ``--announce-dir DIR``     | workers on ports picked at start, shared volume |

Sources can be combined; an address is watched while any source lists it. A new worker joins
at the next DNS resolution or directory scan (seconds); a dead one is marked down by its
watcher within a second, whatever the source (health is not membership).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from services.common.clock import Clock
from services.router.discovery.announce import AnnounceDirDiscovery
from services.router.discovery.dns import DnsDiscovery, DnsTarget, Resolver
from services.router.discovery.membership import Membership
from services.router.fleet import Fleet
from services.router.watcher import WatchConfig

STATIC_SOURCE = "static"


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveryConfig:
    """Where workers come from. ``static``: fixed ``host:port`` addresses. ``dns``: names
    re-resolved every ``dns_interval_s``. ``announce_dir``: a directory of announcement files
    scanned every ``announce_interval_s``. ``watch``: how each worker is followed."""

    static: tuple[str, ...] = ()
    dns: tuple[DnsTarget, ...] = ()
    dns_interval_s: float = 5.0
    announce_dir: Path | None = None
    announce_interval_s: float = 1.0
    watch: WatchConfig = field(default_factory=WatchConfig)

    def __post_init__(self) -> None:
        for name in ("dns_interval_s", "announce_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0")


class Discovery:
    def __init__(
        self,
        *,
        fleet: Fleet,
        clock: Clock,
        config: DiscoveryConfig,
        resolver: Resolver | None = None,
    ) -> None:
        self.config = config
        self.membership = Membership(fleet=fleet, clock=clock, watch=config.watch)
        self.dns = DnsDiscovery(
            targets=config.dns,
            membership=self.membership,
            resolver=resolver,
            interval_s=config.dns_interval_s,
        )
        self.announce = (
            AnnounceDirDiscovery(
                directory=config.announce_dir,
                membership=self.membership,
                interval_s=config.announce_interval_s,
            )
            if config.announce_dir is not None
            else None
        )

    def start(self) -> None:
        """Start watching (call from the event loop)."""
        self.membership.update(STATIC_SOURCE, self.config.static)
        self.dns.start()
        if self.announce is not None:
            self.announce.start()

    def set_static(self, addresses: list[str]) -> None:
        """Replace the static list (tests, and an embedder reloading its configuration)."""
        self.membership.update(STATIC_SOURCE, addresses)

    async def stop(self) -> None:
        await self.dns.stop()
        if self.announce is not None:
            await self.announce.stop()
        await self.membership.stop()
