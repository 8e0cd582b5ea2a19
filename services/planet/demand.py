"""Who asks what, where and when: arrivals at edge sites, following the sun.

Rate. Demand at site ``s`` for tenant ``τ`` at simulated time ``t``:

    λ(s, τ, t) = rate_per_s · pop_share(s) · diurnal(local_hour(s, t)) / mean(diurnal)
                 · share(τ | s) · hotspot(s, τ, t)

``local_hour = start_utc_h + utc_offset_h(s) + t · day_speedup / 3600`` (mod 24), so the peak
moves west with the sun; ``day_speedup`` 24 plays a whole day in an hour. Rates are held
constant over 1-second pieces (Poisson arrivals within a piece; exact for a piecewise-constant
rate, and the diurnal curve moves far slower).

Requests. A request picks a mix by share. With the mix's ``continue_p`` it is the next turn of
one of this site's open conversations (its prompt is the whole previous turn — prompt and
answer — plus a new message, so it shares that prefix), else a new conversation whose prompt
is the tenant's system prompt for the mix (shared by all its conversations) plus a message.
Message and answer lengths are log-normal (see the mixes in ``deploy/sim/planet.yaml`` for the
published statistics they are set from).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass, field

from services.planet.scenario import Distribution, Mix, Scenario, Tenant, TraceRecord
from services.router.scheduling.types import Priority

HASH_BLOCK_TOKENS = 64  # the edge hashes 256-character blocks: ~64 tokens at 4 characters each
MAX_HASH_BLOCKS = 64  # services/edge/prompt.py MAX_BLOCKS
KV_BLOCK = 16
MAX_OPEN_CONVERSATIONS = 4000  # per site and mix


@dataclass(slots=True, eq=False)
class Conversation:
    cid: int
    tokens: int = 0  # prompt + answer of the last finished turn
    turns: int = 0


@dataclass(slots=True, eq=False)
class Request:
    rid: int
    site: int
    tenant: int
    tier: Priority
    model: str
    arrived: float
    prompt: int
    output: int
    max_tokens: int
    allowed: frozenset[str]
    chain: tuple[tuple[object, int], ...]
    extend_key: object
    hashes: tuple[int, ...]
    session: str
    conversation: Conversation | None = None
    mix: int = 0
    messages: tuple[tuple[str, str], ...] = ()
    # progress
    ranked: list[int] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)
    attempts: int = 0
    routes: int = 0
    worker: int = -1
    first_at: float | None = None
    delivered: int = 0  # tokens streamed before a resume
    resumed: bool = False


class Demand:
    """Generates requests in time order (``next_request``)."""

    def __init__(self, sc: Scenario, allowed_for: dict[tuple[str, str], frozenset[str]]) -> None:
        self.sc = sc
        self.rng = random.Random(sc.seed * 7919 + 1)  # what each request asks
        # When and where requests arrive: a stream of its own, so every profile gets the same
        # arrivals even though conversations continue differently under different routing.
        self.clock_rng = random.Random(sc.seed * 7919 + 2)
        self.sites = list(sc.sites.values())
        self.site_index = {s.name: i for i, s in enumerate(self.sites)}
        tr = sc.traffic
        self.mixes = tr.mixes
        self.tenants = tr.tenants
        self._mix_cum = list(itertools.accumulate(m.share for m in tr.mixes))
        pop = sum(s.population_m for s in self.sites) or 1.0
        self._pop_share = [s.population_m / pop for s in self.sites]
        self._diurnal_mean = sum(tr.diurnal) / 24.0
        # (site, tenant) pairs and each tenant's share at that site
        self.pairs: list[tuple[int, int, float]] = []
        for si, s in enumerate(self.sites):
            local = [(ti, t) for ti, t in enumerate(tr.tenants) if not t.sites or s.name in t.sites]
            total = sum(t.share for _, t in local)
            for ti, t in local:
                self.pairs.append((si, ti, t.share / total))
        self.allowed_for = allowed_for
        self._hotspots: list[tuple[float, float, str, str, float]] = [
            (e.at_s, e.at_s + (e.duration_s or math.inf), e.site, e.tenant, e.factor)
            for e in sc.events
            if e.kind == "hotspot"
        ]
        self._open: dict[tuple[int, int], list[Conversation]] = {}
        self._cid = itertools.count(1)
        self._rid = itertools.count(1)
        self._piece_end = 0.0
        self._cum: list[float] = []
        self._total = 0.0
        self._t = 0.0
        self._trace = tr.trace
        self._trace_i = 0
        # A client keeps its prompt within the context it is served with (a longer one would be
        # refused, 400): the smallest context among the workers.
        self._max_len = min((w.config.max_model_len for w in sc.workers), default=8192)

    # --- rates ---------------------------------------------------------------------------

    def local_hour(self, site: int, t: float) -> float:
        sc = self.sc
        h = sc.start_utc_h + self.sites[site].utc_offset_h + t * sc.day_speedup / 3600.0
        return h % 24.0

    def diurnal(self, site: int, t: float) -> float:
        h = self.local_hour(site, t)
        lo = int(h) % 24
        frac = h - int(h)
        d = self.sc.traffic.diurnal
        return (d[lo] * (1 - frac) + d[(lo + 1) % 24] * frac) / self._diurnal_mean

    def _rates(self, t: float) -> list[float]:
        tr = self.sc.traffic
        out = []
        for si, ti, share in self.pairs:
            rate = tr.rate_per_s * self._pop_share[si] * self.diurnal(si, t) * share
            for start, end, site, tenant, factor in self._hotspots:
                here = not site or self.sites[si].name == site
                if start <= t < end and here and (not tenant or self.tenants[ti].name == tenant):
                    rate *= factor
            out.append(rate)
        return out

    def rate_at(self, t: float) -> float:
        return sum(self._rates(t))

    def expected_arrivals(self, max_pieces: int = 20_000) -> float:
        """The mean number of requests the run will generate: said before it starts, so that a
        scenario meant for a minute that would take a day is seen as such. Exact for the
        1-second pieces the rate is held over; a run longer than ``max_pieces`` seconds is
        sampled at evenly spaced pieces."""
        if self._trace is not None:
            return float(sum(1 for r in self._trace if r.at_s < self.sc.duration_s))
        end = self.sc.duration_s
        pieces = math.ceil(end)
        stride = max(1, math.ceil(pieces / max_pieces))
        total = 0.0
        for k in range(0, pieces, stride):
            total += self.rate_at(float(k)) * min(stride, end - k)
        return total

    # --- arrivals ------------------------------------------------------------------------

    def next_request(self) -> Request | None:
        """The next arrival (``None``: no more before the end)."""
        if self._trace is not None:
            return self._from_trace()
        end = self.sc.duration_s
        while True:
            if self._t >= self._piece_end:
                self._piece_end = math.floor(self._t) + 1.0
                rates = self._rates(self._t)
                self._cum = list(itertools.accumulate(rates))
                self._total = self._cum[-1] if self._cum else 0.0
            if self._total <= 0:
                self._t = self._piece_end
            else:
                gap = self.clock_rng.expovariate(self._total)
                if self._t + gap < self._piece_end:
                    self._t += gap
                    if self._t >= end:
                        return None
                    k = bisect.bisect_right(self._cum, self.clock_rng.random() * self._total)
                    si, ti, _ = self.pairs[min(k, len(self.pairs) - 1)]
                    return self._make(si, ti, self._t)
                self._t = self._piece_end  # memoryless: restart in the next piece
            if self._t >= end:
                return None

    def _lognormal(self, d: Distribution) -> int:
        v = math.exp(self.rng.gauss(d.mu(), d.sigma)) if d.sigma > 0 else d.median
        return max(d.lo, min(d.hi, round(v)))

    def _make(self, si: int, ti: int, t: float) -> Request:
        rng = self.rng
        mi = bisect.bisect_right(self._mix_cum, rng.random() * self._mix_cum[-1])
        mi = min(mi, len(self.mixes) - 1)
        mix: Mix = self.mixes[mi]
        tenant: Tenant = self.tenants[ti]
        pool = self._open.setdefault((si, mi), [])
        message = self._lognormal(mix.prompt_tokens)
        output = self._lognormal(mix.output_tokens)
        output = min(output, mix.max_tokens)
        app = ("app", ti, mi)
        sys_tokens = mix.system_tokens
        conv: Conversation
        if pool and rng.random() < mix.continue_p:
            conv = pool.pop(rng.randrange(len(pool)))
            history = conv.tokens
        else:
            conv = Conversation(next(self._cid))
            history = sys_tokens
        prompt = history + message
        limit = self._max_len  # trimmed like a client would, keeping the answer room
        if prompt + output > limit:
            prompt = max(1, limit - output)
            history = min(history, prompt - 1)
        ckey = ("conv", conv.cid)
        chain: tuple[tuple[object, int], ...] = ((app, min(sys_tokens, prompt - 1) // KV_BLOCK),)
        if history > sys_tokens:
            chain += ((ckey, history // KV_BLOCK),)
        site = self.sites[si]
        allowed = self.allowed_for[(tenant.name, site.name)]
        rid = next(self._rid)
        return Request(
            rid=rid,
            site=si,
            tenant=ti,
            tier=tenant.tier,
            model=mix.model,
            arrived=t,
            prompt=prompt,
            output=output,
            # within the context, as the prompt is: more would be refused (400) by the worker
            max_tokens=min(mix.max_tokens, limit - prompt),
            allowed=allowed,
            chain=chain,
            extend_key=ckey,
            hashes=_hashes(hash(app) & 0xFFFFFFFFFFFF, sys_tokens, conv.cid, history, rid, prompt),
            session=f"c{conv.cid}",
            conversation=conv,
            mix=mi,
        )

    def finished(self, req: Request) -> None:
        """A turn ended: its conversation may continue."""
        conv = req.conversation
        if conv is None:
            return
        conv.tokens = req.prompt + req.output
        conv.turns += 1
        pool = self._open.setdefault((req.site, req.mix), [])
        pool.append(conv)
        if len(pool) > MAX_OPEN_CONVERSATIONS:
            del pool[: len(pool) - MAX_OPEN_CONVERSATIONS]

    def _from_trace(self) -> Request | None:
        trace = self._trace
        assert trace is not None
        if self._trace_i >= len(trace):
            return None
        rec: TraceRecord = trace[self._trace_i]
        self._trace_i += 1
        if rec.at_s >= self.sc.duration_s:
            return None
        rid = next(self._rid)
        key = ("trace", rec.prefix_key)
        chain: tuple[tuple[object, int], ...] = ()
        if rec.prefix_key:
            chain = ((key, min(rec.prefix_tokens, rec.prompt_tokens - 1) // KV_BLOCK),)
        shared = rec.shared_hash_blocks
        base = (hash(key) & 0xFFFFFFFFFF) << 12
        own = (rid + (1 << 40)) << 12
        hashes = tuple(range(base, base + shared)) + tuple(
            range(own + shared, own + max(shared, rec.hash_blocks))
        )
        return Request(
            rid=rid,
            site=self.site_index[rec.site],
            tenant=0,
            tier=rec.tier,
            model=rec.model,
            arrived=rec.at_s,
            prompt=rec.prompt_tokens,
            output=rec.output_tokens,
            max_tokens=rec.max_tokens,
            allowed=rec.allowed_regions,
            chain=chain,
            extend_key=None,
            hashes=hashes,
            session="",
            messages=rec.messages,
        )


def _hashes(
    app: int, sys_tokens: int, cid: int, history: int, rid: int, prompt: int
) -> tuple[int, ...]:
    """The edge's chained prefix hashes, as opaque ints: blocks of the tenant's system prompt
    (shared by its conversations), then of the conversation's history, then the new message."""
    n = min(prompt // HASH_BLOCK_TOKENS, MAX_HASH_BLOCKS)
    a = min(sys_tokens // HASH_BLOCK_TOKENS, n)
    h = min(max(a, history // HASH_BLOCK_TOKENS), n)
    app_base = app << 12
    conv_base = (cid + (1 << 41)) << 12
    own = (rid + (1 << 42)) << 12
    return (
        tuple(range(app_base, app_base + a))
        + tuple(range(conv_base + a, conv_base + h))
        + tuple(range(own + h, own + n))
    )
