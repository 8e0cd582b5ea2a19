"""How the router finds workers. Every source feeds one membership; one watcher per address.

- :mod:`.sources`     ``Discovery``: runs the configured sources (static, DNS, directory)
- :mod:`.membership`  ``Membership``: the union of the sources' addresses → watchers
- :mod:`.dns`         ``--worker-dns NAME:PORT``: a name re-resolved periodically
- :mod:`.announce`    ``--announce-dir DIR``: workers announcing themselves in files

What a watcher does with an address (load stream, RTT probes) is ``services/router/watcher.py``;
what the router knows about each worker is ``services/router/fleet.py``.
"""

from services.router.discovery.sources import Discovery, DiscoveryConfig

__all__ = ["Discovery", "DiscoveryConfig"]
