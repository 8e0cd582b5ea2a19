"""Scenarios as data: one YAML file → a validated, frozen :class:`Scenario`.

Every problem is reported at once, each with its location (``fleet.groups[1].gpu: unknown gpu
'h1000' (known: a100, h100)``), before anything is built. The shape (see
``deploy/sim/planet.yaml`` for a full example, ``docs/planet.md`` for every key):

    name, seed, duration_s, engine (fast | exact), start_utc_h, day_speedup
    world:    {regions, sites, calibration}   file names (relative to the scenario) or inline lists
    sites:    "*" or [names]                  the edge sites that exist (one router replica each)
    network:  {path_stretch, overhead_ms, jitter_ms, loss, links: [{site, region, rtt_ms, loss}]}
    fleet:    {gpus: {name: SimConfig keys}, groups: [{regions, workers, gpu, models}]}
    router:   {profile, report_interval_ms, route_ms, service_ms, early_report_load,
               stale_after_ms, ...}
    traffic:  {rate_per_s, diurnal[24], mixes: [...], tenants: [...]} or {trace: file.jsonl}
    background: [{region, streams_per_worker, prompt_tokens, max_tokens}]
    events:   [{kind: region-outage | link-degraded | worker-crash | hotspot | model-rollout, ...}]
    slo:      {ttft_ms, itl_ms}
    report:   {interval_s, sample_decisions, oscillation_window_s}
    limits:   {max_memory_mib}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.common import yamlfile
from services.common.cli import UnreadableFile, read_text
from services.planet.errors import ScenarioError
from services.planet.geo import RttModel
from services.planet.reader import Node, Problems
from services.planet.world import (
    Region,
    Site,
    calibrate,
    name_problem,
    read_calibration,
    read_regions,
    read_sites,
)
from services.router.scheduling.types import Priority
from services.worker.sim.config import SimConfig, SimConfigError

ENGINES = ("fast", "exact")
TRACE_MAX_BYTES = 1 << 30
"""The largest request trace (JSON lines) a scenario may replay."""
MAX_DURATION_S = 7 * 86400
"""The longest simulated run (and the latest arrival a trace may hold): a week."""
MAX_TRACE_LINES_REPORTED = 20
"""Bad trace lines whose problems are listed; the rest are counted (a million bad lines must
not become a million-line error)."""
_TRACE_KEYS = (
    "at_s", "site", "model", "prompt_tokens", "output_tokens", "max_tokens", "prefix_key",
    "prefix_tokens", "hash_blocks", "shared_hash_blocks", "tier", "allowed_regions", "messages",
)  # fmt: skip
MAX_REQUEST_TOKENS = 10_000_000
MAX_RATE_PER_S = 1_000_000.0
"""The highest mean arrival rate: a thousand times the planet's (the simulator serves a few
thousand requests a CPU-second, so a rate past this is a run that never ends, not a scenario)."""
MAX_HOTSPOT_FACTOR = 10_000.0
"""The most a hotspot may multiply a site's rate by, for the same reason."""
MAX_BACKGROUND_STREAMS = 10_000
"""Background streams per worker: far past any engine's max_num_seqs (the rest only queue)."""
MIN_OSCILLATION_WINDOW_S = 0.01
MAX_RTT_MS = 60_000.0
"""A link's round trip, or what a degraded link adds to it: a minute is past any TCP timeout."""
"""The most tokens a mix may give a prompt or an answer: ten times the longest context
served today (a median of 1e308 overflowed the default maximum, median × 20)."""
EVENT_KINDS = ("region-outage", "link-degraded", "worker-crash", "hotspot", "model-rollout")
TIERS = {"low": Priority.LOW, "standard": Priority.STANDARD, "high": Priority.HIGH}
#: Default diurnal shape (relative demand by local hour, 0..23): a trough before dawn at about a
#: third of the afternoon peak, business hours and the evening high. An assumption of this
#: model (shape of typical interactive web traffic), overridable per scenario.
DEFAULT_DIURNAL: tuple[float, ...] = (
    0.45, 0.38, 0.33, 0.30, 0.30, 0.33, 0.42, 0.55, 0.72, 0.86, 0.95, 1.00,
    1.00, 0.98, 0.97, 0.96, 0.95, 0.93, 0.92, 0.93, 0.92, 0.85, 0.72, 0.57,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Distribution:
    """Token counts: log-normal with this median and log-sd, clipped to [lo, hi]."""

    median: float
    sigma: float
    lo: int
    hi: int

    def mu(self) -> float:
        return math.log(self.median)


@dataclass(frozen=True, slots=True)
class Mix:
    name: str
    share: float
    model: str
    prompt_tokens: Distribution
    output_tokens: Distribution
    system_tokens: int  # an app's system prompt, shared by every conversation of a tenant
    continue_p: float  # probability an arrival is the next turn of an open conversation
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    share: float
    tier: Priority
    residency: tuple[str, ...]  # zones; ("local",) = the user's site's zone; () = anywhere
    sites: frozenset[str]  # empty: every site


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    worker_id: str
    region: str
    gpu: str
    config: SimConfig
    models: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Link:
    site: str
    region: str
    rtt_ms: float | None
    loss: float | None


@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    at_s: float
    duration_s: float | None  # None: until the end
    region: str = ""
    site: str = ""
    count: int = 0
    factor: float = 1.0
    tenant: str = ""
    extra_rtt_ms: float = 0.0
    loss: float = 0.0
    model: str = ""
    regions: tuple[str, ...] = ()
    load_s: float = 0.0
    mode: str = "crash"


@dataclass(frozen=True, slots=True)
class Background:
    region: str
    streams_per_worker: int
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class RouterSpec:
    profile: Path
    report_interval_s: float
    route_s: float
    #: Meridian's own processing on a request's way to the engine, outside the decision, the
    #: network and the engine: the edge's pipeline, the Generate call's set-up, the stream's
    #: hops. Measured on a real stack (``bench.planet_fidelity``'s calibration pass); 0 = free.
    service_s: float
    early_report_load: float
    stale_after_s: float
    probe_delay_s: float
    max_attempts: int
    connect_timeout_s: float
    report_deadband: float


@dataclass(frozen=True, slots=True)
class TraceRecord:
    at_s: float
    site: str
    model: str
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    prefix_key: str
    prefix_tokens: int
    hash_blocks: int
    shared_hash_blocks: int
    tier: Priority
    allowed_regions: frozenset[str]
    messages: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Traffic:
    rate_per_s: float
    diurnal: tuple[float, ...]
    mixes: tuple[Mix, ...]
    tenants: tuple[Tenant, ...]
    trace: tuple[TraceRecord, ...] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    source: str
    name: str
    seed: int
    duration_s: float
    engine: str
    start_utc_h: float
    day_speedup: float
    regions: Mapping[str, Region]
    sites: Mapping[str, Site]
    rtt_model: RttModel
    jitter_ms: float
    loss: float
    links: tuple[Link, ...]
    workers: tuple[WorkerSpec, ...]
    router: RouterSpec
    traffic: Traffic
    background: tuple[Background, ...]
    events: tuple[Event, ...]
    slo_ttft_ms: float
    slo_itl_ms: float | None
    report_interval_s: float
    sample_decisions: int
    oscillation_window_s: float
    max_memory_mib: float | None
    fleet_regions: tuple[str, ...] = field(default=())

    def models(self) -> set[str]:
        return {m for w in self.workers for m in w.models}

    def zone_regions(self, zone: str) -> frozenset[str]:
        return frozenset(r for r in self.fleet_regions if self.regions[r].zone == zone)


_TOP = (
    "name", "seed", "duration_s", "engine", "start_utc_h", "day_speedup", "world", "sites",
    "network", "fleet", "router", "traffic", "background", "events", "slo", "report", "limits",
)  # fmt: skip


def load_scenario(path: str | Path, *, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Read, validate and build a scenario; raises :class:`ScenarioError` naming every bad key.

    ``overrides``: top-level keys replaced after reading (the command line's ``--duration``)."""
    path = Path(path)
    try:
        doc = yamlfile.safe_load(read_text(path))
    except UnreadableFile as err:  # missing, a directory, not UTF-8, ...
        raise ScenarioError(str(path), [f"cannot read: {err.reason}"]) from None
    except yaml.YAMLError as err:
        raise ScenarioError(str(path), [f"invalid YAML: {err}"]) from None
    shortened = False
    if isinstance(doc, dict) and overrides:
        shortened = "duration_s" in overrides
        doc = {**doc, **overrides}
    return build(doc, source=str(path), base=path.parent, shortened=shortened)


def build(doc: Any, *, source: str, base: Path, shortened: bool = False) -> Scenario:
    """``shortened``: the duration was overridden (events past the new end are then dropped
    instead of being an error)."""
    problems = Problems()
    root = Node(problems, doc, "")
    if not root.mapping(_TOP):
        raise ScenarioError(source, problems.items)
    b = _Builder(root, problems, base)
    b.shortened = shortened
    scenario = b.scenario(source)
    if problems.items or scenario is None:
        raise ScenarioError(source, problems.items or ["invalid scenario"])
    return scenario


def _word(node: Node, default: str | None = None, *, zone: bool = False) -> str:
    """A region code, site name or zone (``world.name_problem`` says what one may be)."""
    value = node.string(default)
    problem = name_problem(value, zone=zone) if value else None
    if problem is not None:
        node.fail(problem)
    return value


class _UniqueNames:
    """Names that must differ (tenants, mixes: hotspots and the report find them by name)."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()

    def check(self, node: Node, kind: str) -> str:
        name = node.string()
        if name and (kind, name) in self.seen:
            node.fail(f"{kind} {name!r} listed twice")
        self.seen.add((kind, name))
        return name


class _Builder:
    def __init__(self, root: Node, problems: Problems, base: Path) -> None:
        self.root = root
        self.problems = problems
        self.base = base
        self.regions: dict[str, Region] = {}
        self.sites: dict[str, Site] = {}
        self.shortened = False
        self.fleet_complete = True
        """False once a fleet group is refused: the regions and models it would have added are
        then unknown, and a reference to one is not reported as a second, misleading problem."""

    def path(self, node: Node) -> Path:
        p = Path(node.string())
        if p.is_absolute() or (self.base / p).exists():
            return p if p.is_absolute() else self.base / p
        repo = Path(__file__).resolve().parents[2] / p  # repository-relative, as documented
        return repo if repo.exists() else self.base / p

    def unserved(self, region: str, fleet_regions: tuple[str, ...]) -> bool:
        """Whether naming ``region`` is a problem: no worker there, and not because a refused
        fleet group (already reported) would have put them there."""
        if region in fleet_regions:
            return False
        return self.fleet_complete or region not in self.regions

    def scenario(self, source: str) -> Scenario | None:
        r = self.root
        name_node = r.get("name")
        name = name_node.string("scenario")
        if len(name) > 200 or not name.isprintable():  # it heads the report and every line
            name_node.fail(f"must be one line of printable text, at most 200 characters: {name!r}")
        seed = r.get("seed").integer(1)
        duration = r.get("duration_s").number(lo=0, hi=MAX_DURATION_S, lo_open=True)
        engine = r.get("engine").string("fast", choices=ENGINES)
        start = r.get("start_utc_h").number(0.0, lo=0, hi=24)
        speedup = r.get("day_speedup").number(1.0, lo=0, hi=10_000)
        model = self.world(r.get("world"))
        if model is None:
            return None
        site_names = self.site_selection(r.get("sites"))
        jitter, loss, links, model = self.network(r.get("network"), site_names, model)
        before = len(self.problems.items)
        workers = self.fleet(r.get("fleet"))
        self.fleet_complete = len(self.problems.items) == before
        fleet_regions = tuple(dict.fromkeys(w.region for w in workers))
        router = self.router(r.get("router"))
        traffic = self.traffic(r.get("traffic"), site_names, {m for w in workers for m in w.models})
        background = tuple(self.background(r.get("background"), fleet_regions))
        events = tuple(self.events(r.get("events"), site_names, fleet_regions, traffic, duration))
        slo = r.get("slo")
        slo_ttft = slo_itl = None
        if not slo.missing and slo.mapping(("ttft_ms", "itl_ms")):
            slo_ttft = slo.get("ttft_ms").number(500.0, lo=0, lo_open=True)
            itl = slo.get("itl_ms")
            slo_itl = None if itl.missing else itl.number(lo=0, lo_open=True)
        rep = r.get("report")
        interval, sample, osc = 60.0, 40, 10.0
        if not rep.missing and rep.mapping(
            ("interval_s", "sample_decisions", "oscillation_window_s")
        ):
            iv = rep.get("interval_s")
            interval = iv.number(60.0, lo=1, hi=MAX_DURATION_S)
            if interval != round(interval):  # the clock that closes intervals ticks each second
                iv.fail(f"must be a whole number of seconds, got {iv.value!r}")
            sample = rep.get("sample_decisions").integer(40, lo=0, hi=10_000)
            osc = rep.get("oscillation_window_s").number(
                10.0, lo=MIN_OSCILLATION_WINDOW_S, hi=MAX_DURATION_S
            )
        lim = r.get("limits")
        max_mem = None
        if not lim.missing and lim.mapping(("max_memory_mib",)):
            m = lim.get("max_memory_mib")
            max_mem = None if m.missing else m.number(lo=1)
        if self.problems.items:
            return None
        return Scenario(
            source=source,
            name=name,
            seed=seed,
            duration_s=duration,
            engine=engine,
            start_utc_h=start,
            day_speedup=speedup,
            regions=self.regions,
            sites={n: self.sites[n] for n in site_names},
            rtt_model=model,
            jitter_ms=jitter,
            loss=loss,
            links=links,
            workers=tuple(workers),
            router=router,
            traffic=traffic,
            background=background,
            events=events,
            slo_ttft_ms=slo_ttft if slo_ttft is not None else 500.0,
            slo_itl_ms=slo_itl,
            report_interval_s=interval,
            sample_decisions=sample,
            oscillation_window_s=osc,
            max_memory_mib=max_mem,
            fleet_regions=fleet_regions,
        )

    # --- world ---------------------------------------------------------------------------

    def world(self, node: Node) -> RttModel | None:
        if node.missing:
            node = Node(self.problems, {}, "world")
        if not node.mapping(("regions", "sites", "calibration")):
            return None
        defaults = {
            "regions": "deploy/sim/regions.csv",
            "sites": "deploy/sim/sites.csv",
            "calibration": "deploy/sim/calibration.csv",
        }
        try:
            regions_node = node.get("regions")
            if isinstance(regions_node.value, list):
                self.regions = self.inline_regions(regions_node)
            else:
                p = self.path(
                    regions_node if not regions_node.missing else _str(node, "regions", defaults)
                )
                self.regions = read_regions(p)
            sites_node = node.get("sites")
            if isinstance(sites_node.value, list):
                self.sites = self.inline_sites(sites_node)
            else:
                p = self.path(
                    sites_node if not sites_node.missing else _str(node, "sites", defaults)
                )
                self.sites = read_sites(p)
            cal = node.get("calibration")
            if isinstance(cal.value, Mapping):
                if cal.mapping(("path_stretch", "overhead_ms")):
                    return RttModel(
                        path_stretch=cal.get("path_stretch").number(lo=1),
                        overhead_ms=cal.get("overhead_ms").number(lo=0),
                    )
                return None
            p = self.path(cal if not cal.missing else _str(node, "calibration", defaults))
            all_regions = read_regions(self.path(_str(node, "regions", defaults)))
            measured = read_calibration(p, all_regions)
            return calibrate(all_regions, measured)[0]
        except ScenarioError as err:
            for problem in err.problems:
                self.problems.add(f"world ({err.source})", problem)
            return None

    def inline_regions(self, node: Node) -> dict[str, Region]:
        out: dict[str, Region] = {}
        for el in node.elements():
            if el.mapping(("code", "provider", "city", "lat", "lon", "zone")):
                code = _word(el.get("code"))
                if code in out:
                    el.get("code").fail(f"region {code!r} listed twice")
                out[code] = Region(
                    code=code,
                    provider=el.get("provider").string("custom"),
                    city=el.get("city").string(code),
                    lat=el.get("lat").number(lo=-90, hi=90),
                    lon=el.get("lon").number(lo=-180, hi=180),
                    zone=_word(el.get("zone"), code, zone=True),
                )
        return out

    def inline_sites(self, node: Node) -> dict[str, Site]:
        out: dict[str, Site] = {}
        for el in node.elements():
            if el.mapping(("name", "lat", "lon", "utc_offset_h", "population_m", "zone")):
                name = _word(el.get("name"))
                if name in out:
                    el.get("name").fail(f"site {name!r} listed twice")
                out[name] = Site(
                    name=name,
                    lat=el.get("lat").number(lo=-90, hi=90),
                    lon=el.get("lon").number(lo=-180, hi=180),
                    utc_offset_h=el.get("utc_offset_h").number(0.0, lo=-12, hi=14),
                    population_m=el.get("population_m").number(1.0, lo=0, hi=1000),
                    zone=_word(el.get("zone"), name, zone=True),
                )
        return out

    def site_selection(self, node: Node) -> list[str]:
        if node.missing or node.value == "*":
            return list(self.sites)
        names = node.strings()
        for i, n in enumerate(names):
            if n not in self.sites:
                node.fail(f"unknown site {n!r} (known: {', '.join(sorted(self.sites))})")
            elif n in names[:i]:
                node.fail(f"site {n!r} listed twice")
        return list(dict.fromkeys(n for n in names if n in self.sites))

    def network(
        self, node: Node, sites: list[str], model: RttModel
    ) -> tuple[float, float, tuple[Link, ...], RttModel]:
        if node.missing:
            return 0.0, 0.0, (), model
        if not node.mapping(("path_stretch", "overhead_ms", "jitter_ms", "loss", "links")):
            return 0.0, 0.0, (), model
        if node.has("path_stretch") or node.has("overhead_ms"):
            try:
                model = RttModel(
                    # Fibre paths run 1.2-2.5x the great circle; past 10x, or a second of
                    # fixed overhead, is a typo, not a network.
                    path_stretch=node.get("path_stretch").number(model.path_stretch, lo=1, hi=10),
                    overhead_ms=node.get("overhead_ms").number(model.overhead_ms, lo=0, hi=1000),
                )
            except ValueError as err:
                node.fail(str(err))
        jitter = node.get("jitter_ms").number(0.0, lo=0, hi=1000)
        loss = node.get("loss").number(0.0, lo=0, hi=0.5)
        links = []
        ln = node.get("links")
        if not ln.missing:
            seen: set[tuple[str, str]] = set()
            for el in ln.elements():
                if not el.mapping(("site", "region", "rtt_ms", "loss")):
                    continue
                site = el.get("site").string()
                region = el.get("region").string()
                if (site, region) in seen:
                    el.fail(f"the link {site} - {region} is listed twice")
                seen.add((site, region))
                if site not in sites:
                    el.get("site").fail(f"unknown site {site!r}")
                if region not in self.regions:
                    el.get("region").fail(f"unknown region {region!r}")
                rtt = el.get("rtt_ms")
                lo = el.get("loss")
                links.append(
                    Link(
                        site,
                        region,
                        None if rtt.missing else rtt.number(lo=0, lo_open=True, hi=MAX_RTT_MS),
                        None if lo.missing else lo.number(lo=0, hi=0.5),
                    )
                )
        return jitter, loss, tuple(links), model

    # --- fleet ---------------------------------------------------------------------------

    def fleet(self, node: Node) -> list[WorkerSpec]:
        if not node.mapping(("gpus", "groups")):
            return []
        gpus: dict[str, SimConfig] = {}
        refused: set[str] = set()  # defined but invalid: already reported, not "unknown"
        gn = node.get("gpus")
        for name, spec in gn.items():
            if not isinstance(spec.value, Mapping):
                spec.fail("must be a mapping of SimConfig settings")
                refused.add(name)
                continue
            try:
                gpus[name] = SimConfig.from_mapping(spec.value)
            except SimConfigError as err:
                self.problems.add(f"{spec.path}.{err.key}", str(err).split(": ", 1)[-1])
                refused.add(name)
        workers: list[WorkerSpec] = []
        per_region: dict[str, int] = {}
        for g in node.get("groups").elements():
            if not g.mapping(("regions", "workers", "gpu", "models")):
                continue
            regions = self.region_selection(g.get("regions"))
            count = g.get("workers").integer(lo=1, hi=100_000)
            gpu = g.get("gpu").string()
            if gpu in refused:
                continue
            if gpu and gpu not in gpus:
                g.get("gpu").fail(
                    f"unknown gpu {gpu!r} (known: {', '.join(sorted(gpus)) or 'none'})"
                )
                continue
            models = tuple(g.get("models").strings())
            config = gpus.get(gpu)
            if config is None:
                continue
            try:
                config = SimConfig.from_mapping({**_config_dict(config), "models": list(models)})
            except SimConfigError as err:
                g.get("models").fail(str(err))
                continue
            for region in regions:
                for _ in range(count):
                    n = per_region.get(region, 0) + 1
                    per_region[region] = n
                    workers.append(WorkerSpec(f"{region}-{n}", region, gpu, config, models))
        if not workers and not self.problems.items:
            node.get("groups").fail("the fleet has no workers")
        return workers

    def region_selection(self, node: Node) -> list[str]:
        v = node.value
        if v == "*":
            return list(self.regions)
        if isinstance(v, Mapping):
            if not node.mapping(("zone", "provider", "codes")):
                return []
            out = list(self.regions)
            if node.has("zone"):
                zones = set(node.get("zone").strings())
                out = [r for r in out if self.regions[r].zone in zones]
            if node.has("provider"):
                providers = set(node.get("provider").strings())
                out = [r for r in out if self.regions[r].provider in providers]
            if node.has("codes"):
                codes = node.get("codes").strings()
                out = [r for r in out if r in codes]
            if not out:
                node.fail("selects no region")
            return out
        codes = node.strings()
        for c in codes:
            if c not in self.regions:
                node.fail(f"unknown region {c!r}")
        return [c for c in codes if c in self.regions]

    # --- router --------------------------------------------------------------------------

    def router(self, node: Node) -> RouterSpec:
        keys = (
            "profile", "report_interval_ms", "route_ms", "service_ms", "early_report_load",
            "stale_after_ms", "probe_delay_ms", "max_attempts", "connect_timeout_ms",
            "report_deadband",
        )  # fmt: skip
        if node.missing:
            node = Node(self.problems, {}, "router")
        node.mapping(keys)
        profile = node.get("profile")
        path = (
            self.path(profile)
            if not profile.missing
            else self.path(
                Node(self.problems, "deploy/router/profiles/default.yaml", "router.profile")
            )
        )
        if not path.exists():
            profile.fail(f"no such profile file: {path}")
        return RouterSpec(
            profile=path,
            report_interval_s=node.get("report_interval_ms").number(100.0, lo=20, hi=60_000) / 1e3,
            route_s=node.get("route_ms").number(1.0, lo=0, hi=10_000) / 1e3,
            service_s=node.get("service_ms").number(0.0, lo=0, hi=10_000) / 1e3,
            early_report_load=node.get("early_report_load").number(0.9, lo=0, hi=1),
            stale_after_s=node.get("stale_after_ms").number(600.0, lo=1) / 1e3,
            probe_delay_s=node.get("probe_delay_ms").number(300.0, lo=0) / 1e3,
            max_attempts=node.get("max_attempts").integer(3, lo=1, hi=10),
            connect_timeout_s=node.get("connect_timeout_ms").number(1000.0, lo=1) / 1e3,
            report_deadband=node.get("report_deadband").number(0.0, lo=0, hi=1),
        )

    # --- traffic -------------------------------------------------------------------------

    def traffic(self, node: Node, sites: list[str], models: set[str]) -> Traffic:
        empty = Traffic(0.0, DEFAULT_DIURNAL, (), (), None)
        if not node.mapping(("rate_per_s", "diurnal", "mixes", "tenants", "trace")):
            return empty
        if node.has("trace"):
            for key in ("rate_per_s", "diurnal", "mixes", "tenants"):
                if node.has(key):  # silently ignored, it would look like it did something
                    node.get(key).fail(
                        "not used with a trace (its records say when, where and what)"
                    )
            return Traffic(
                0.0, DEFAULT_DIURNAL, (), (), self.trace(node.get("trace"), sites, models)
            )
        rate = node.get("rate_per_s").number(lo=0, lo_open=True, hi=MAX_RATE_PER_S)
        diurnal = DEFAULT_DIURNAL
        dn = node.get("diurnal")
        if not dn.missing:
            values = [el.number(lo=0) for el in dn.elements()]
            if len(values) != 24:
                dn.fail(f"must list 24 hourly weights, got {len(values)}")
            elif not any(values):
                dn.fail("must not be all zero")
            else:
                diurnal = tuple(values)
        mixes = []
        unique = _UniqueNames()
        for el in node.get("mixes").elements():
            keys = ("name", "share", "model", "prompt_tokens", "output_tokens", "system_tokens",
                    "continue_p", "max_tokens")  # fmt: skip
            if not el.mapping(keys):
                continue
            model = el.get("model").string()
            if model and model not in models and self.fleet_complete:
                el.get("model").fail(
                    f"no worker serves model {model!r} (served: {', '.join(sorted(models))})"
                )
            mixes.append(
                Mix(
                    name=unique.check(el.get("name"), "mix"),
                    share=el.get("share").number(lo=0, lo_open=True),
                    model=model,
                    prompt_tokens=self.distribution(el.get("prompt_tokens")),
                    output_tokens=self.distribution(el.get("output_tokens")),
                    system_tokens=el.get("system_tokens").integer(0, lo=0, hi=100_000),
                    continue_p=el.get("continue_p").number(0.0, lo=0, hi=0.99),
                    max_tokens=el.get("max_tokens").integer(4096, lo=1, hi=MAX_REQUEST_TOKENS),
                )
            )
        if not mixes:
            node.get("mixes").fail("at least one request mix is required")
        tenants = []
        for el in node.get("tenants").elements():
            if not el.mapping(("name", "share", "tier", "residency", "sites")):
                continue
            res_node = el.get("residency")
            residency: tuple[str, ...] = ()
            if not res_node.missing and res_node.value != "any":
                residency = tuple(res_node.strings())
                zones = {r.zone for r in self.regions.values()}
                for z in residency:
                    if z != "local" and z not in zones:
                        res_node.fail(
                            f"unknown zone {z!r} (known: local, any, {', '.join(sorted(zones))})"
                        )
            site_set: frozenset[str] = frozenset()
            if el.has("sites"):
                names = el.get("sites").strings()
                for n in names:
                    if n not in sites:
                        el.get("sites").fail(f"unknown site {n!r}")
                site_set = frozenset(names)
            tenants.append(
                Tenant(
                    name=unique.check(el.get("name"), "tenant"),
                    share=el.get("share").number(lo=0, lo_open=True),
                    tier=TIERS[el.get("tier").string("standard", choices=tuple(TIERS))],
                    residency=residency,
                    sites=site_set,
                )
            )
        if not tenants:
            tenants = [Tenant("default", 1.0, Priority.STANDARD, (), frozenset())]
        return Traffic(rate, diurnal, tuple(mixes), tuple(tenants), None)

    def distribution(self, node: Node) -> Distribution:
        if not node.mapping(("median", "sigma", "min", "max")):
            return Distribution(1, 0, 1, 1)
        median = node.get("median").number(lo=1, hi=MAX_REQUEST_TOKENS)
        lo = node.get("min").integer(1, lo=1, hi=MAX_REQUEST_TOKENS)
        hi = node.get("max").integer(
            max(lo, min(int(median * 20), MAX_REQUEST_TOKENS)), lo=lo, hi=MAX_REQUEST_TOKENS
        )
        return Distribution(median, node.get("sigma").number(0.0, lo=0, hi=5), lo, hi)

    def trace(self, node: Node, sites: list[str], models: set[str]) -> tuple[TraceRecord, ...]:
        path = self.path(node)
        try:
            lines = read_text(path, max_bytes=TRACE_MAX_BYTES).splitlines()
        except UnreadableFile as err:  # missing, a directory, not UTF-8, ...
            node.fail(f"cannot read {path}: {err.reason}")
            return ()
        out = []
        bad_lines = 0
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{node.path} ({path.name} line {i})"
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError) as err:
                rec = err
            line_problems = Problems()
            record = self.trace_record(Node(line_problems, rec, where), sites, models)
            if record is not None:
                out.append(record)
                continue
            if bad_lines < MAX_TRACE_LINES_REPORTED:
                self.problems.items.extend(line_problems.items)
            bad_lines += 1
        if bad_lines > MAX_TRACE_LINES_REPORTED:
            node.fail(f"and {bad_lines - MAX_TRACE_LINES_REPORTED} more bad lines")
        out.sort(key=lambda r: r.at_s)
        return tuple(out)

    def trace_record(self, rec: Node, sites: list[str], models: set[str]) -> TraceRecord | None:
        """One line of a trace, every field checked where it is (None when any is bad)."""
        if isinstance(rec.value, Exception):
            rec.fail(f"not JSON: {rec.value}")
            return None
        before = len(rec.problems.items)
        if not rec.mapping(_TRACE_KEYS):
            return None
        site = rec.get("site").string(choices=sites)
        model = rec.get("model").string()
        if model and model not in models and self.fleet_complete:
            rec.get("model").fail(f"no worker serves model {model!r}")
        prompt = rec.get("prompt_tokens").integer(hi=MAX_REQUEST_TOKENS)
        output = rec.get("output_tokens").integer(lo=1, hi=MAX_REQUEST_TOKENS)
        hash_blocks = rec.get("hash_blocks").integer(0, hi=MAX_REQUEST_TOKENS)
        regions = rec.get("allowed_regions")
        allowed = regions.strings() if not regions.missing and regions.value != [] else []
        for region in allowed:
            if region not in self.regions:
                regions.fail(f"unknown region {region!r}")
        messages = rec.get("messages")
        pairs: list[tuple[str, str]] = []
        for m in messages.elements() if not messages.missing else ():
            if not (isinstance(m.value, list) and len(m.value) == 2
                    and all(isinstance(x, str) for x in m.value)):  # fmt: skip
                m.fail(f"must be a [role, content] pair of strings, got {m.value!r}")
                continue
            pairs.append((m.value[0], m.value[1]))
        prefix_key = rec.get("prefix_key")
        if not prefix_key.missing and not isinstance(prefix_key.value, str):
            prefix_key.fail(f"must be a string, got {prefix_key.value!r}")
        record = TraceRecord(
            at_s=rec.get("at_s").number(lo=0, hi=MAX_DURATION_S),
            site=site,
            model=model,
            prompt_tokens=prompt,
            output_tokens=output,
            max_tokens=rec.get("max_tokens").integer(output, lo=output, hi=MAX_REQUEST_TOKENS),
            prefix_key=prefix_key.value if isinstance(prefix_key.value, str) else "",
            prefix_tokens=rec.get("prefix_tokens").integer(0, hi=prompt),
            hash_blocks=hash_blocks,
            shared_hash_blocks=rec.get("shared_hash_blocks").integer(0, hi=hash_blocks),
            tier=TIERS[rec.get("tier").string("standard", choices=tuple(TIERS))],
            allowed_regions=frozenset(allowed),
            messages=tuple(pairs),
        )
        return record if len(rec.problems.items) == before else None

    def background(self, node: Node, regions: tuple[str, ...]) -> list[Background]:
        if node.missing:
            return []
        out = []
        for el in node.elements():
            if not el.mapping(("region", "streams_per_worker", "prompt_tokens", "max_tokens")):
                continue
            region = el.get("region").string()
            if self.unserved(region, regions):
                el.get("region").fail(f"no worker in region {region!r}")
            out.append(
                Background(
                    region,
                    el.get("streams_per_worker").integer(lo=1, hi=MAX_BACKGROUND_STREAMS),
                    el.get("prompt_tokens").integer(16, lo=1, hi=MAX_REQUEST_TOKENS),
                    el.get("max_tokens").integer(128, lo=1, hi=MAX_REQUEST_TOKENS),
                )
            )
        return out

    def events(
        self,
        node: Node,
        sites: list[str],
        regions: tuple[str, ...],
        traffic: Traffic,
        duration: float,
    ) -> list[Event]:
        if node.missing:
            return []
        out = []
        tenants = {t.name for t in traffic.tenants}
        models = {m.model for m in traffic.mixes}
        for el in node.elements():
            keys = ("kind", "at_s", "duration_s", "region", "site", "count", "factor", "tenant",
                    "extra_rtt_ms", "loss", "model", "regions", "load_s", "mode")  # fmt: skip
            if not el.mapping(keys):
                continue
            kind = el.get("kind").string(choices=EVENT_KINDS)
            at = el.get("at_s").number(lo=0)
            if at > duration:
                if self.shortened:
                    continue
                el.get("at_s").fail(f"is after the end of the scenario ({duration:g} s)")
            dn = el.get("duration_s")
            dur = None if dn.missing else dn.number(lo=0, lo_open=True)
            ev = Event(kind=kind, at_s=at, duration_s=dur)
            if kind in ("region-outage", "worker-crash", "link-degraded"):
                region = el.get("region").string()
                if region and self.unserved(region, regions):
                    el.get("region").fail(f"no worker in region {region!r}")
                ev = _replace(ev, region=region)
            if kind == "region-outage":
                ev = _replace(
                    ev, mode=el.get("mode").string("crash", choices=("crash", "partition"))
                )
            if kind == "worker-crash":
                ev = _replace(ev, count=el.get("count").integer(1, lo=1))
            if kind in ("link-degraded", "hotspot"):
                site = el.get("site").string("" if kind == "hotspot" else None)
                if site and site not in sites:
                    el.get("site").fail(f"unknown site {site!r}")
                ev = _replace(ev, site=site)
            if kind == "link-degraded":
                ev = _replace(
                    ev,
                    extra_rtt_ms=el.get("extra_rtt_ms").number(0.0, lo=0, hi=MAX_RTT_MS),
                    loss=el.get("loss").number(0.0, lo=0, hi=0.5),
                )
            if kind == "hotspot":
                tenant = el.get("tenant").string("") if el.has("tenant") else ""
                if tenant and tenant not in tenants:
                    el.get("tenant").fail(f"unknown tenant {tenant!r}")
                factor = el.get("factor").number(lo=0, lo_open=True, hi=MAX_HOTSPOT_FACTOR)
                ev = _replace(ev, factor=factor, tenant=tenant)
            if kind == "model-rollout":
                model = el.get("model").string()
                rs = self.region_selection(el.get("regions"))
                for r in rs:
                    if self.unserved(r, regions):
                        el.get("regions").fail(f"no worker in region {r!r}")
                if model and traffic.mixes and model not in models:
                    el.get("model").fail(f"no request mix asks for model {model!r}")
                ev = _replace(
                    ev, model=model, regions=tuple(rs), load_s=el.get("load_s").number(30.0, lo=0)
                )
            out.append(ev)
        return out


def _str(node: Node, key: str, defaults: dict[str, str]) -> Node:
    return Node(node.problems, defaults[key], f"{node.path}.{key}")


def _replace(ev: Event, **changes: Any) -> Event:
    from dataclasses import replace

    return replace(ev, **changes)


def _config_dict(config: SimConfig) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(config, f.name) for f in fields(config)}
