"""Scenarios: the shipped ones load; bad ones are refused with every problem located."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.planet.errors import ScenarioError, ScenarioTooLarge
from services.planet.main import check_memory, main
from services.planet.scenario import build, load_scenario

from .conftest import ROOT


@pytest.mark.parametrize("name", ["planet", "planet-10min", "hotspot"])
def test_shipped_scenarios_load(name: str) -> None:
    sc = load_scenario(ROOT / "deploy/sim" / f"{name}.yaml")
    assert sc.workers
    assert sc.sites


def test_the_planet_is_the_size_the_issue_asks_for() -> None:
    sc = load_scenario(ROOT / "deploy/sim/planet.yaml")
    assert 95 <= len(sc.fleet_regions) <= 110
    assert 9_000 <= len(sc.workers) <= 11_000
    assert len(sc.sites) == 30
    assert sc.duration_s == 3600
    kinds = {e.kind for e in sc.events}
    assert {"region-outage", "hotspot"} <= kinds


def problems(doc: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(ScenarioError) as err:
        build(doc, source="s.yaml", base=ROOT)
    return err.value.problems


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.update(duraton_s=5), "duraton_s: unknown key"),
        (lambda d: d.update(duration_s=-1), "duration_s: must be > 0"),
        (
            lambda d: d["fleet"]["groups"][0].update(gpu="h1000"),
            "fleet.groups[0].gpu: unknown gpu 'h1000'",
        ),
        (
            lambda d: d["fleet"]["groups"][1].update(regions=["mars"]),
            "fleet.groups[1].regions: unknown region 'mars'",
        ),
        (
            lambda d: d["fleet"]["gpus"]["small"].update(max_num_seqs=0),
            "fleet.gpus.small.max_num_seqs",
        ),
        (
            lambda d: d["traffic"]["mixes"][0].update(model="gpt-9"),
            "traffic.mixes[0].model: no worker serves model 'gpt-9'",
        ),
        (
            lambda d: d["traffic"]["mixes"][0]["prompt_tokens"].update(median=0),
            "traffic.mixes[0].prompt_tokens.median: must be >= 1",
        ),
        (
            lambda d: d["traffic"]["tenants"][1].update(residency="moon"),
            "traffic.tenants[1].residency: unknown zone 'moon'",
        ),
        (
            lambda d: d["traffic"]["tenants"][0].update(tier="gold"),
            "traffic.tenants[0].tier: must be one of",
        ),
        (
            lambda d: d.update(events=[{"kind": "region-outage", "region": "eu", "at_s": 1}]),
            "events[0].region: no worker in region 'eu'",
        ),
        (
            lambda d: d.update(events=[{"kind": "meteor", "at_s": 1}]),
            "events[0].kind: must be one of",
        ),
        (
            lambda d: d.update(events=[{"kind": "hotspot", "at_s": 99, "factor": 2}]),
            "events[0].at_s: is after the end",
        ),
        (
            lambda d: d.update(router={"profile": "nope.yaml"}),
            "router.profile: no such profile file",
        ),
        (
            lambda d: d.update(router={"report_interval_ms": 1}),
            "router.report_interval_ms: must be >= 20",
        ),
        (lambda d: d.update(sites=["seoul", "paris"]), "sites: unknown site 'paris'"),
        (
            lambda d: d.update(router={"service_ms": -1}),
            "router.service_ms: must be >= 0",
        ),
    ],
)
def test_a_bad_scenario_names_the_key(small: dict[str, Any], edit: Any, expected: str) -> None:
    edit(small)
    found = problems(small)
    assert any(expected in p for p in found), found


def test_every_problem_is_reported_at_once(small: dict[str, Any]) -> None:
    small["seed"] = "x"
    small["traffic"]["rate_per_s"] = 0
    small["fleet"]["groups"][0]["workers"] = 0
    assert len(problems(small)) == 3


def test_a_scenario_too_large_for_memory_is_refused_up_front_with_the_estimate(
    small: dict[str, Any],
) -> None:
    small["limits"] = {"max_memory_mib": 50}
    sc = build(small, source="s.yaml", base=ROOT)
    with pytest.raises(ScenarioTooLarge) as err:
        check_memory(sc)
    assert err.value.estimate_mib > 50
    assert "MiB" in str(err.value)
    assert "router views" in str(err.value)


def test_the_command_exits_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nduration_s: ten\n")
    assert main(["--scenario", str(bad), "--no-progress"]) == 2
    assert "duration_s: must be a number" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["--scenario", str(bad), "--duration", "-3"])
    assert exit_.value.code == 2
    assert "--duration" in capsys.readouterr().err
