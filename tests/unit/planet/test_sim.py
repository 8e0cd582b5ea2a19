"""The simulator's behaviour: residency holds, failures are routed around, tiers are shed in
order, replicas see the world late."""

from __future__ import annotations

import bisect
import gc
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.planet.scenario import build
from services.planet.sim import Planet, long_lived_heap
from services.planet.view import RegionLog, Report, SiteView, StaticWorker
from services.router.scheduling.regional import RegionSummary
from services.router.scheduling.types import ModelState, ModelStatus

from .conftest import ROOT


def run(doc: dict[str, Any]) -> Planet:
    planet = Planet(build(doc, source="s.yaml", base=ROOT), record=True)
    planet.run()
    return planet


def test_pinned_tenants_are_served_only_in_their_zone_even_when_it_is_full(
    small: dict[str, Any],
) -> None:
    small["traffic"]["rate_per_s"] = 60  # more than kr and jp hold
    small["traffic"]["tenants"][1]["share"] = 0.8
    planet = run(small)
    m = planet.metrics
    assert m.residency_violations == 0
    served = {(site, region) for (site, region), n in m.served.items()}
    pinned_regions = {"seoul": "kr", "tokyo": "jp"}
    assert all(region in pinned_regions.values() or site for site, region in served)
    assert sum(n for (t, r), n in m.refused.items() if r == "saturated") > 0  # shed, not moved


def test_a_region_outage_moves_traffic_away_and_back(small: dict[str, Any]) -> None:
    small["traffic"]["tenants"] = [{"name": "a", "share": 1, "tier": "standard"}]
    small["duration_s"] = 30
    small["events"] = [{"kind": "region-outage", "region": "jp", "at_s": 10, "duration_s": 10}]
    small["report"] = {"interval_s": 5}
    planet = run(small)
    by_interval = {round(row["t_s"]): row["regions"] for row in planet.metrics.series}
    assert by_interval[5].get("jp", 0) > 0
    assert by_interval[20].get("jp", 0) == 0  # 15..20 s: jp is down
    assert by_interval[30].get("jp", 0) > 0  # and back
    m = planet.metrics
    assert m.residency_violations == 0
    assert not any(reason == "failed" for _, reason in m.refused)  # failover found a worker
    assert sum(m.refused.values()) < 0.05 * planet.requests  # kr + us are smaller: a few shed


def test_a_low_tier_flood_is_shed_and_the_high_tier_keeps_its_latency(
    small: dict[str, Any],
) -> None:
    small["duration_s"] = 30
    small["traffic"]["tenants"] = [
        {"name": "vip", "share": 0.2, "tier": "high"},
        {"name": "batch", "share": 0.8, "tier": "low"},
    ]
    calm = run(small).metrics
    small["events"] = [
        {"kind": "hotspot", "tenant": "batch", "factor": 8, "at_s": 5, "duration_s": 25}
    ]
    flood = run(small).metrics
    assert sum(n for (t, _), n in flood.refused.items() if t == "low") > 100
    assert sum(n for (t, _), n in flood.refused.items() if t == "high") == 0
    assert flood.goodput(["high"]) >= calm.goodput(["high"]) - 0.02
    p99_calm = calm.ttft[("tier", "high")].percentile(0.99)
    assert flood.ttft[("tier", "high")].percentile(0.99) < 2 * p99_calm + 100


def test_a_replica_sees_a_report_one_way_delay_after_it_was_sent() -> None:
    models = (ModelStatus("m", ModelState.READY, 8192),)
    idle = Report(0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, models, False, ())
    workers = [StaticWorker("w1", "far", 0, "sim://w1", 8)]
    view = SiteView("s", workers, rtt_ms=[200.0], loss=[0.0], initial=[idle])
    view.assign(0, 42)
    log = RegionLog()
    report = Report(1.0, 5, 0, 0.5, 0.0, 0.0, 0.0, models, False, (42,))
    log.append(1.0, 0, report, (1, 8, 5, frozenset({"m"})))
    assert view.sync(1.05, [log])[0].running == 0  # still on its way (one way: 100 ms)
    assert view.sync(1.05, [log])[0].in_flight == 1
    row = view.sync(1.10, [log])[0]
    assert (row.running, row.in_flight) == (5, 0)  # arrived, and it names our request


def test_a_replica_reads_a_regions_aggregate_one_way_late_plus_its_own_requests() -> None:
    models = (ModelStatus("m", ModelState.READY, 8192),)
    idle = Report(0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, models, False, ())
    workers = [StaticWorker("w1", "far", 0, "sim://w1", 8)]
    view = SiteView("s", workers, rtt_ms=[200.0], loss=[0.0], initial=[idle])
    log = RegionLog((1, 8, 0, frozenset({"m"})))
    log.append(
        1.0,
        0,
        Report(1.0, 5, 0, 0.5, 0.0, 0.0, 0.0, models, False, ()),
        (1, 8, 5, frozenset({"m"})),
    )
    view.advance(1.05, [log])
    (s,) = view.summaries()
    assert (s.region, s.capacity, s.busy, s.rtt_ms) == ("far", 8, 0, 200.0)  # not here yet
    view.assign(0, 7)
    view.advance(1.10, [log])
    (s,) = view.summaries()
    assert s.busy == 6  # the report (5 busy), and the request this replica sent since
    log.trim(1)  # the log moves on; the replica's view of the region stays
    view.advance(1.20, [log])
    assert view.summaries()[0].busy == 6


def test_a_replicas_region_summary_is_re_read_only_when_something_reached_it() -> None:
    models = (ModelStatus("m", ModelState.READY, 8192),)
    idle = Report(0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, models, False, ())
    workers = [StaticWorker("w1", "far", 0, "sim://w1", 8)]
    view = SiteView("s", workers, rtt_ms=[200.0], loss=[0.0], initial=[idle])
    log = RegionLog((1, 8, 0, frozenset({"m"})))
    view.advance(1.0, [log])
    (first,) = view.summaries()
    log.append(1.0, 0, idle, (1, 8, 0, frozenset({"m"})))  # same figures, on its way
    log.append(1.01, 0, idle, (1, 8, 3, frozenset({"m"})))
    view.advance(1.09, [log])
    assert view.summaries()[0] is first  # nothing has arrived from there yet
    view.advance(1.10, [log])
    assert view.summaries()[0] is first  # the first report arrived: same figures, same object
    view.advance(1.11, [log])
    (second,) = view.summaries()
    assert second.busy == 3
    view.assign(0, 7)  # this replica's own request: read again at once
    assert view.summaries()[0].busy == 4


def test_a_profile_with_region_pre_selection_routes_the_small_world(
    small: dict[str, Any], tmp_path: Path
) -> None:
    doc = yaml.safe_load((ROOT / "deploy/router/profiles/default.yaml").read_text())
    doc["profiles"]["default"]["regions"] = {"max_regions": 1}
    profile = tmp_path / "regional.yaml"
    profile.write_text(yaml.safe_dump(doc))
    small["duration_s"] = 30
    small["router"] = {"profile": str(profile)}
    small["traffic"]["tenants"] = [{"name": "a", "share": 1, "tier": "standard"}]
    small["events"] = [{"kind": "region-outage", "region": "jp", "at_s": 10, "duration_s": 10}]
    small["report"] = {"interval_s": 5, "sample_decisions": 50}
    planet = run(small)
    m = planet.metrics
    assert m.residency_violations == 0
    assert not any(reason == "failed" for _, reason in m.refused)
    by_interval = {round(row["t_s"]): row["regions"] for row in planet.metrics.series}
    assert by_interval[20].get("jp", 0) == 0
    assert by_interval[30].get("jp", 0) > 0
    assert any("[regions:" in str(d) for d in m.samples)


def test_every_region_summary_a_replica_hands_out_is_what_a_fresh_read_would_give(
    small: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summaries are re-read only when something can have changed them (view.py); this
    checks each one, at every decision of a run with an outage, against reading the region's
    log at the replica's horizon from scratch."""
    doc = yaml.safe_load((ROOT / "deploy/router/profiles/default.yaml").read_text())
    doc["profiles"]["default"]["regions"] = {"max_regions": 1}
    profile = tmp_path / "regional.yaml"
    profile.write_text(yaml.safe_dump(doc))
    small["duration_s"] = 20
    small["router"] = {"profile": str(profile)}
    small["events"] = [{"kind": "region-outage", "region": "jp", "at_s": 5, "duration_s": 5}]
    checked = [0]
    summaries = SiteView.summaries

    def checking(view: SiteView) -> list[RegionSummary]:
        out = summaries(view)
        for g, at in enumerate(view._summary_at):
            if at < 0:
                continue
            log = view._logs[g]
            i = bisect.bisect_right(log.change_times, view._now - view.owd_s[g])
            healthy, cap, busy, models = log.change_aggs[i - 1] if i else log.initial
            s = out[at]
            assert (s.healthy, s.capacity, s.busy, s.rtt_ms, s.models) == (
                healthy, cap, min(cap, busy + view._own[g]),
                view.rtt_ms[g] if healthy else None, models,
            )  # fmt: skip
            checked[0] += 1
        return out

    monkeypatch.setattr(SiteView, "summaries", checking)
    run(small)
    assert checked[0] > 1000


def test_a_run_leaves_the_garbage_collector_as_it_found_it() -> None:
    before = gc.get_threshold()
    with long_lived_heap():
        assert gc.get_threshold() != before
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_trace_request_longer_than_the_context_is_refused_as_the_worker_would(
    tmp_path: Path, small: dict[str, Any]
) -> None:
    import json

    records = [
        {"at_s": 0.5, "site": "seoul", "model": "m", "prompt_tokens": 90, "output_tokens": 9},
        # max_model_len is 8192: a prompt past it, and one that leaves no room for its answer
        {"at_s": 1.0, "site": "seoul", "model": "m", "prompt_tokens": 10_000, "output_tokens": 9},
        {"at_s": 1.5, "site": "tokyo", "model": "m", "prompt_tokens": 8000, "output_tokens": 300},
    ]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    doc = {**small, "duration_s": 3, "traffic": {"trace": "trace.jsonl"}}
    planet = Planet(build(doc, source="s.yaml", base=tmp_path))
    stats = planet.run()
    m = planet.metrics
    assert stats.requests == 3
    assert m.refused == {("standard", "context_length_exceeded"): 2}
    assert m.ttft[("site", "seoul")].count == 1  # the short one was served
    assert planet.open == 0  # nothing left waiting in an engine for ever


def test_mix_requests_fit_the_context_as_a_client_trims_them(small: dict[str, Any]) -> None:
    """Long conversations near a small context: the simulated clients trim the prompt and
    ask for no more than the room left (max_tokens 4096 > the 2,048 context), so the
    workers refuse none of them."""
    small["fleet"]["gpus"]["small"]["max_model_len"] = 2048
    small["traffic"]["mixes"][0].update(prompt_tokens={"median": 1500, "sigma": 0.5})
    small["traffic"]["mixes"][0]["continue_p"] = 0.9
    small["duration_s"] = 10
    planet = Planet(build(small, source="s.yaml", base=ROOT))
    stats = planet.run()
    assert stats.requests > 100
    assert not any(reason == "context_length_exceeded" for _, reason in planet.metrics.refused)
    assert sum(h.count for (kind, _), h in planet.metrics.ttft.items() if kind == "all") > 100
