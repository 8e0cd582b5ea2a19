"""When each chunk of one direction of one connection may leave the proxy.

The schedule is the whole network model, kept free of sockets and of the event loop so it is
tested with plain numbers. For chunk *i* read at time ``t_i``::

    d_i       = max(0, delay + U(-jitter, +jitter)) + (rto if U(0, 1) < loss else 0)
    release_i = max(t_i + d_i, release_{i-1})

The ``max`` with the previous release is what keeps a TCP stream in order: a chunk that drew
a short delay waits behind one that drew a long delay (or a loss stall), exactly as
head-of-line blocking does on a real link. Throughput is not limited by the delay: chunks read
close together are released close together.

The profile is read per chunk, so a live ``set_delay`` applies to everything read after it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from services.netem.config import LinkProfile


class LinkSchedule:
    """Release times for one direction of one connection.

    ``profile`` is called once per chunk (the proxy's current link, which can change live);
    ``rng_key`` makes the jitter and loss draws reproducible (the proxy uses
    ``"{seed}/{route}/{connection}/{direction}"``); ``on_stall`` is told of each loss stall.
    """

    def __init__(
        self,
        profile: Callable[[], LinkProfile],
        *,
        rng_key: str,
        on_stall: Callable[[], None] | None = None,
    ) -> None:
        self._profile = profile
        self._rng = random.Random(rng_key)
        self._on_stall = on_stall
        self._last_release = float("-inf")

    def release_at(self, now: float) -> float:
        """The time (same clock as ``now``) the chunk read at ``now`` may be written on."""
        link = self._profile()
        delay_s = link.delay_ms / 1000.0
        if link.jitter_ms > 0:
            delay_s = max(0.0, delay_s + self._rng.uniform(-link.jitter_ms, link.jitter_ms) / 1000)
        if link.loss > 0 and self._rng.random() < link.loss:
            if self._on_stall is not None:
                self._on_stall()
            delay_s += link.rto_ms / 1000.0
        release = max(now + delay_s, self._last_release)
        self._last_release = release
        return release
