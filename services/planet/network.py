"""The wide-area network between edge sites and regions: who is how far, right now.

Base round-trip time per (site, region) from the calibrated great-circle model
(:mod:`.geo`), unless the scenario pins a link (``network.links``). On top of it, per message:

- jitter: one-way extra delay drawn from an exponential distribution with mean ``jitter_ms``;
- loss: a request lost on the way to the worker waits for TCP's retransmission timeout
  (``max(200 ms, 2·RTT)``, Linux's minimum RTO); a lost first-token message costs one more RTT
  (fast retransmit on a stream that is already flowing).

Degraded links (events) add RTT and loss to one (site, region) pair from the event's start; the
router replica of that site learns the new values only after its probes have measured them
(``router.probe_delay_ms``), see :mod:`.view`.
"""

from __future__ import annotations

import random

from services.planet.geo import great_circle_km
from services.planet.scenario import Scenario

MIN_RTO_S = 0.2


class Network:
    def __init__(self, sc: Scenario, sites: list[str], regions: list[str], seed: int) -> None:
        self.rng = random.Random(seed)
        self.jitter_s = sc.jitter_ms / 1000.0
        self.base_rtt_ms: list[list[float]] = []
        self.base_loss: list[list[float]] = []
        pinned = {(lk.site, lk.region): lk for lk in sc.links}
        for s in sites:
            site = sc.sites[s]
            rtts, losses = [], []
            for r in regions:
                reg = sc.regions[r]
                lk = pinned.get((s, r))
                d = great_circle_km(site.lat, site.lon, reg.lat, reg.lon)
                rtt = (
                    lk.rtt_ms
                    if lk is not None and lk.rtt_ms is not None
                    else sc.rtt_model.rtt_ms(d)
                )
                loss = lk.loss if lk is not None and lk.loss is not None else sc.loss
                rtts.append(rtt)
                losses.append(loss)
            self.base_rtt_ms.append(rtts)
            self.base_loss.append(losses)
        self.rtt_ms = [list(r) for r in self.base_rtt_ms]
        self.loss = [list(r) for r in self.base_loss]

    def one_way_s(self, site: int, region: int) -> float:
        return self.rtt_ms[site][region] / 2000.0

    def to_worker_s(self, site: int, region: int) -> float:
        """Delay of a request from the edge to a worker (jitter and loss included)."""
        d = self.rtt_ms[site][region] / 2000.0
        if self.jitter_s > 0:
            d += self.rng.expovariate(1.0 / self.jitter_s)
        loss = self.loss[site][region]
        if loss > 0 and self.rng.random() < loss:
            d += max(MIN_RTO_S, 2 * self.rtt_ms[site][region] / 1000.0)
        return d

    def to_edge_s(self, site: int, region: int, first: bool) -> float:
        """Delay of a token message back to the edge (the first one may be lost)."""
        d = self.rtt_ms[site][region] / 2000.0
        if self.jitter_s > 0:
            d += self.rng.expovariate(1.0 / self.jitter_s)
        loss = self.loss[site][region]
        if first and loss > 0 and self.rng.random() < loss:
            d += self.rtt_ms[site][region] / 1000.0
        return d

    def degrade(self, site: int, region: int, extra_rtt_ms: float, loss: float) -> None:
        self.rtt_ms[site][region] = self.base_rtt_ms[site][region] + extra_rtt_ms
        self.loss[site][region] = max(self.base_loss[site][region], loss)

    def restore(self, site: int, region: int) -> None:
        self.rtt_ms[site][region] = self.base_rtt_ms[site][region]
        self.loss[site][region] = self.base_loss[site][region]
