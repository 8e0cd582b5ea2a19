"""Scenarios: the shipped ones load; bad ones are refused with every problem located."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.planet.errors import ScenarioError, ScenarioTooLarge
from services.planet.main import check_memory, main
from services.planet.scenario import build, load_scenario
from tests.support.interrupt import start_module

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
            lambda d: d["traffic"]["mixes"][0]["output_tokens"].update(median=1e308),
            "traffic.mixes[0].output_tokens.median: must be",
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
        # Values that would make a run that never ends (a billion requests a second, a hotspot
        # a trillion times over) or that grows without bound (a window of a nanosecond).
        (
            lambda d: d["traffic"].update(rate_per_s=1e9),
            "traffic.rate_per_s: must be > 0 and <= 1e+06, got 1000000000.0",
        ),
        (
            lambda d: d.update(events=[{"kind": "hotspot", "at_s": 1, "factor": 1e12}]),
            "events[0].factor: must be > 0 and <= 10000",
        ),
        (
            lambda d: d.update(report={"oscillation_window_s": 1e-9}),
            "report.oscillation_window_s: must be >= 0.01",
        ),
        (lambda d: d.update(report={"interval_s": 0.5}), "report.interval_s: must be >= 1"),
        (
            lambda d: d.update(report={"interval_s": 1.5}),
            "report.interval_s: must be a whole number of seconds, got 1.5",
        ),
        (
            lambda d: d.update(background=[{"region": "us", "streams_per_worker": 10**9}]),
            "background[0].streams_per_worker: must be >= 1 and <= 10000",
        ),
        (
            lambda d: d.update(
                background=[{"region": "us", "streams_per_worker": 1, "prompt_tokens": 10**9}]
            ),
            "background[0].prompt_tokens: must be >= 1 and <= 10000000",
        ),
        (
            lambda d: d.update(
                background=[{"region": "us", "streams_per_worker": 1, "max_tokens": 10**9}]
            ),
            "background[0].max_tokens: must be >= 1 and <= 10000000",
        ),
        (
            lambda d: d["traffic"]["mixes"][0].update(max_tokens=10**9),
            "traffic.mixes[0].max_tokens: must be >= 1 and <= 10000000",
        ),
    ],
)
def test_a_bad_scenario_names_the_key(small: dict[str, Any], edit: Any, expected: str) -> None:
    edit(small)
    found = problems(small)
    assert any(expected in p for p in found), found


def test_a_refused_fleet_group_is_one_problem_not_one_per_reference_to_its_regions(
    small: dict[str, Any],
) -> None:
    small["fleet"]["groups"][1]["gpu"] = "h1000"  # the group that puts workers in "us"
    small["background"] = [{"region": "us", "streams_per_worker": 2}]
    small["events"] = [{"kind": "region-outage", "region": "us", "at_s": 1}]
    assert problems(small) == ("fleet.groups[1].gpu: unknown gpu 'h1000' (known: small)",)


def test_a_region_no_group_serves_is_still_a_problem_when_another_group_is_refused(
    small: dict[str, Any],
) -> None:
    small["fleet"]["groups"][1]["gpu"] = "h1000"
    small["background"] = [{"region": "mars", "streams_per_worker": 2}]
    found = problems(small)
    assert "background[0].region: no worker in region 'mars'" in found, found


def test_background_streams_count_in_the_memory_estimate(small: dict[str, Any]) -> None:
    from services.planet.memory import estimate

    plain, _ = estimate(build(small, source="s.yaml", base=ROOT))
    small["background"] = [{"region": "kr", "streams_per_worker": 10_000}]
    busy, _ = estimate(build(small, source="s.yaml", base=ROOT))
    # two kr workers x 10,000 streams, ~2 KB each
    assert busy - plain == pytest.approx(2 * 10_000 * 2_000 / 2**20, rel=0.01)


def test_affinity_maps_count_in_the_memory_estimate_bounded_by_max_entries(
    small: dict[str, Any], tmp_path: Path
) -> None:
    """A 10-minute planet run under the default profile peaked at 1,769 MiB against an
    estimate of 988 MiB: its prefix-affinity maps (200,000 entries per replica) were not
    counted. They are now, for the profile that runs, and never beyond max_entries."""
    from services.planet.main import profile_path
    from services.planet.memory import AFFINITY_ENTRY_B, estimate

    def prefix_profile(max_entries: int) -> Path:
        # power-of-two with a prefix-affinity scorer beside its load scorer
        text = profile_path("power-of-two").read_text()
        load = "      - type: load\n        weight: 1\n"
        assert load in text
        affinity = (
            "      - {type: prefix-affinity, weight: 1, "
            f"params: {{max_entries: {max_entries}}}}}\n"
        )
        path = tmp_path / f"p{max_entries}.yaml"
        path.write_text(text.replace(load, load + affinity))
        return path

    small["traffic"]["rate_per_s"] = 1000
    small["duration_s"] = 600
    sc = build(small, source="s.yaml", base=ROOT)
    none, _ = estimate(sc, [profile_path("power-of-two")])
    capped, breakdown = estimate(sc, [prefix_profile(1000)])
    assert "affinity maps" in breakdown
    replicas = len(sc.sites)
    assert capped - none == pytest.approx(
        replicas * 1000 * AFFINITY_ENTRY_B["prefix-affinity"] / 2**20, rel=0.01
    )
    roomy, _ = estimate(sc, [prefix_profile(10**9)])  # bounded by the traffic instead
    assert capped < roomy < none + 10_000
    # the largest of the profiles that will run decides
    both, _ = estimate(sc, [profile_path("power-of-two"), prefix_profile(1000)])
    assert both == capped


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


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\xff\xfe", "not UTF-8 text (byte 0xff at offset 0)"),
        (b"name: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 9)"),
        ("dir", "Is a directory"),
    ],
)
def test_a_scenario_that_is_not_utf8_text_exits_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | str, reason: str
) -> None:
    path = tmp_path / "s.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.mkdir()
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.problems == (f"cannot read: {reason}",)
    assert main(["--scenario", str(path), "--no-progress"]) == 2
    out = capsys.readouterr().err
    assert f"error: {path}: cannot read: {reason}" in out
    assert "Traceback" not in out


def test_a_trace_or_world_table_that_is_not_utf8_is_a_located_problem(
    tmp_path: Path, small: dict[str, Any]
) -> None:
    (tmp_path / "trace.jsonl").write_bytes(b'{"site": "seoul"}\n\xff\n')
    (tmp_path / "regions.csv").write_bytes(b"code,lat\n\xfe\n")
    traced = {**small, "traffic": {"trace": "trace.jsonl"}}
    assert any(
        "cannot read" in p and "not UTF-8 text (byte 0xff at offset 18)" in p
        for p in problems_at(traced, tmp_path)
    )
    tabled = {**small, "world": {**small["world"], "regions": "regions.csv"}}
    assert any(
        "cannot read: not UTF-8 text (byte 0xfe at offset 9)" in p
        for p in problems_at(tabled, tmp_path)
    )


def problems_at(doc: dict[str, Any], base: Path) -> tuple[str, ...]:
    with pytest.raises(ScenarioError) as err:
        build(doc, source="s.yaml", base=base)
    return err.value.problems


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--duration", "inf"], "argument --duration: must be a finite number, got 'inf'"),
        (["--duration", "nan"], "argument --duration: must be a finite number, got 'nan'"),
        (["--duration", "0"], "argument --duration: must be > 0, got 0"),
        (["--out", "{file}/report"], "argument --out: cannot create '{file}/report': '{file}'"),
        (["--out", "{file}"], "argument --out: '{file}' is not a directory"),
        (["--profiles", "{bad}"], "--profiles: {bad}: cannot read: not UTF-8 text"),
        (["--jobs", "0"], "argument --jobs: must be 'auto' or a count 1..256, got '0'"),
        (["--jobs", "many"], "argument --jobs: must be 'auto' or a count 1..256, got 'many'"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], problem: str
) -> None:
    names = {"file": str(tmp_path / "file"), "bad": str(tmp_path / "bad.yaml")}
    (tmp_path / "file").write_text("x")
    (tmp_path / "bad.yaml").write_bytes(b"\xff\xfe")
    # A scenario that does not exist: were a flag let through, main would return 2 for it
    # instead of exiting at the flag (and nothing is ever simulated).
    argv = ["--scenario", str(tmp_path / "missing.yaml"), "--no-progress"]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, *(f.format(**names) for f in flags)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert problem.format(**names) in err
    assert "Traceback" not in err


def test_combine_refuses_a_results_file_that_is_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "results.json"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(SystemExit) as exit_:
        main(["--combine", str(bad), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert f"--combine: cannot read {bad}: not UTF-8 text" in capsys.readouterr().err


def test_a_scenario_whose_router_profile_is_not_utf8_exits_2_before_simulating(
    tmp_path: Path, small: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    (tmp_path / "bad.yaml").write_bytes(b"\xff\xfe")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**small, "router": {"profile": "bad.yaml"}}))
    assert main(["--scenario", str(path), "--no-progress", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"router.profile: {tmp_path / 'bad.yaml'}: cannot read: not UTF-8 text" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{}", "not a bench.planet results.json: missing key 'scenario'"),
        ("[1]", "not a bench.planet results.json: expected an object (or a list of them), got int"),
        ("[]", "--combine: the files hold no results"),
        ('"text"', "expected an object (or a list of them), got str"),
    ],
)
def test_combine_refuses_json_that_is_not_a_planet_result_naming_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, problem: str
) -> None:
    bad = tmp_path / "results.json"
    bad.write_text(content)
    with pytest.raises(SystemExit) as exit_:
        main(["--combine", str(bad), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert problem in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_combine_of_a_malformed_result_keeps_the_good_results_json_it_would_overwrite(
    tmp_path: Path, small: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**small, "duration_s": 2}))
    out = tmp_path / "out"
    assert main(["--scenario", str(path), "--no-progress", "--out", str(out)]) == 0
    good = (out / "results.json").read_text()
    result = json.loads(good)
    result = result[0] if isinstance(result, list) else result
    assert main(["--combine", str(out / "results.json"), "--out", str(out)]) == 0  # the real thing
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**result, "series": [{"t_s": "soon"}]}))
    with pytest.raises(SystemExit) as exit_:
        main(["--combine", str(broken), "--out", str(out)])
    assert exit_.value.code == 2
    assert "--combine: a result is malformed" in capsys.readouterr().err
    assert (out / "results.json").read_text() == json.dumps(result, indent=1)


GOOD_RECORD = {"at_s": 1.5, "site": "seoul", "model": "m", "prompt_tokens": 90, "output_tokens": 9}


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"at_s": -5}, "line 1).at_s: must be >= 0 and <= 604800, got -5"),
        ({"prompt_tokens": -930}, "line 1).prompt_tokens: must be >= 0"),
        ({"prompt_tokens": 1e300}, "line 1).prompt_tokens: must be an integer"),
        ({"output_tokens": 0}, "line 1).output_tokens: must be >= 1"),
        ({"max_tokens": 3}, "line 1).max_tokens: must be >= 9"),
        ({"prefix_tokens": 91}, "line 1).prefix_tokens: must be >= 0 and <= 90"),
        ({"site": "paris"}, "line 1).site: must be one of seoul, tokyo, got 'paris'"),
        ({"model": "gpt-9"}, "line 1).model: no worker serves model 'gpt-9'"),
        ({"tier": "gold"}, "line 1).tier: must be one of low, standard, high"),
        ({"allowed_regions": ["mars"]}, "line 1).allowed_regions: unknown region 'mars'"),
        ({"messages": [1]}, "line 1).messages[0]: must be a [role, content] pair of strings"),
        ({"colour": "red"}, "line 1).colour: unknown key"),
    ],
)
def test_a_bad_trace_record_names_the_line_and_the_field(
    tmp_path: Path, small: dict[str, Any], edit: dict[str, Any], problem: str
) -> None:
    import json

    (tmp_path / "trace.jsonl").write_text(json.dumps({**GOOD_RECORD, **edit}) + "\n")
    found = problems_at({**small, "traffic": {"trace": "trace.jsonl"}}, tmp_path)
    assert any(f"traffic.trace (trace.jsonl {problem}" in p for p in found), found


def test_a_trace_record_that_is_not_json_or_not_finite_is_a_located_problem(
    tmp_path: Path, small: dict[str, Any]
) -> None:
    lines = ['{"at_s": NaN, "site": "seoul"}', "[" * 100_000, "{{"]
    (tmp_path / "trace.jsonl").write_text("\n".join(lines) + "\n")
    found = problems_at({**small, "traffic": {"trace": "trace.jsonl"}}, tmp_path)
    assert any("(trace.jsonl line 1).at_s: must be a number, got nan" in p for p in found)
    assert any("(trace.jsonl line 2): not JSON: maximum recursion depth" in p for p in found)
    assert any("(trace.jsonl line 3): not JSON: Expecting property name" in p for p in found)


def test_a_trace_of_many_bad_lines_lists_the_first_twenty_and_counts_the_rest(
    tmp_path: Path, small: dict[str, Any]
) -> None:
    import json

    good = json.dumps(GOOD_RECORD)
    bad = json.dumps({**GOOD_RECORD, "output_tokens": 0})
    (tmp_path / "trace.jsonl").write_text("\n".join([good] + [bad] * 5000) + "\n")
    found = problems_at({**small, "traffic": {"trace": "trace.jsonl"}}, tmp_path)
    assert len(found) == 21
    assert found[-1] == "traffic.trace: and 4980 more bad lines"


def test_a_good_trace_record_is_read_with_its_defaults(
    tmp_path: Path, small: dict[str, Any]
) -> None:
    import json

    (tmp_path / "trace.jsonl").write_text(json.dumps(GOOD_RECORD) + "\n")
    sc = build({**small, "traffic": {"trace": "trace.jsonl"}}, source="s.yaml", base=tmp_path)
    assert sc.traffic.trace is not None
    (record,) = sc.traffic.trace
    assert (record.at_s, record.site, record.prompt_tokens, record.max_tokens) == (
        1.5,
        "seoul",
        90,
        9,
    )
    assert (record.prefix_key, record.prefix_tokens, record.allowed_regions) == ("", 0, frozenset())


def write_small(tmp_path: Path, doc: dict[str, Any]) -> Path:
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("combine", [False, True])
def test_an_out_folder_that_cannot_be_made_exits_2_before_the_run(
    tmp_path: Path,
    small: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    combine: bool,
) -> None:
    import services.planet.main as planet_main

    if combine:
        argv = ["--combine", str(_a_results_json(tmp_path, small))]
    else:
        argv = ["--scenario", str(write_small(tmp_path, {**small, "duration_s": 2}))]
    ran: list[object] = []

    def run_one(*args: object) -> dict[str, Any]:
        ran.append(args)
        return {}

    monkeypatch.setattr(planet_main, "run_one", run_one)
    # /proc refuses new folders to everyone, root included (a chmod would not stop root).
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--no-progress", "--out", "/proc/meridian-planet-test/report"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --out: cannot create '/proc/meridian-planet-test/report'" in err
    assert "Traceback" not in err
    assert ran == []


def _a_results_json(tmp_path: Path, small: dict[str, Any]) -> Path:
    out = tmp_path / "first"
    assert main(["--scenario", str(write_small(tmp_path, {**small, "duration_s": 2})),
                 "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    return out / "results.json"


def test_a_profile_path_without_a_yaml_suffix_is_read_as_the_path_given(
    tmp_path: Path, small: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine"
    mine.write_text((ROOT / "deploy/router/profiles/least-loaded.yaml").read_text())
    path = write_small(tmp_path, {**small, "duration_s": 2})
    out = tmp_path / "out"
    argv = ["--scenario", str(path), "--no-progress", "--out", str(out), "--profiles", str(mine)]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("mine ")
    with pytest.raises(SystemExit) as exit_:
        main([*argv[:-1], "least-lodaed"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--profiles: no such profile: least-lodaed (shipped: default," in err
    assert "least-loaded" in err


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["default", "default"], "--profiles: 'default' is given twice"),
        (
            ["default", str(ROOT / "deploy/router/profiles/default.yaml")],
            "--profiles: 'default' and '" + str(ROOT) + "/deploy/router/profiles/default.yaml' "
            "are the same profile: give it once",
        ),
        (["default", "{tmp}/default.yaml"], "--profiles: two profiles named 'default' ("),
    ],
)
def test_profiles_the_report_could_not_tell_apart_are_refused_before_any_run(
    tmp_path: Path,
    small: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    given: list[str],
    said: str,
) -> None:
    (tmp_path / "default.yaml").write_text(
        (ROOT / "deploy/router/profiles/least-loaded.yaml").read_text()
    )
    path = write_small(tmp_path, {**small, "duration_s": 2})
    out = tmp_path / "out"
    profiles = [g.format(tmp=tmp_path) for g in given]
    with pytest.raises(SystemExit) as exit_:
        main(["--scenario", str(path), "--no-progress", "--out", str(out), "--profiles", *profiles])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert said in captured.err
    assert captured.out == ""  # refused before the first run
    assert not out.exists()


def test_combine_refuses_the_same_profiles_results_twice(
    tmp_path: Path, small: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    one = tmp_path / "one"
    path = write_small(tmp_path, {**small, "duration_s": 2})
    assert main(["--scenario", str(path), "--no-progress", "--out", str(one)]) == 0
    capsys.readouterr()
    results = str(one / "results.json")
    with pytest.raises(SystemExit) as exit_:
        main(["--combine", results, results, "--out", str(tmp_path / "both")])
    assert exit_.value.code == 2
    assert "--combine: profile 'default' appears more than once" in capsys.readouterr().err
    assert not (tmp_path / "both").exists()


def test_the_header_says_how_many_requests_the_run_will_generate(
    tmp_path: Path, small: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import re

    path = write_small(tmp_path, {**small, "duration_s": 30})
    assert main(["--scenario", str(path), "--no-progress", "--out", str(tmp_path / "o")]) == 0
    said = re.search(r"~([\d,]+) requests per profile", capsys.readouterr().err)
    assert said is not None
    expected = int(said.group(1).replace(",", ""))
    result = json.loads((tmp_path / "o/results.json").read_text())
    result = result[0] if isinstance(result, list) else result
    # Poisson: 600-odd arrivals are within a few standard deviations (~25) of their mean
    assert abs(result["requests"] - expected) < 5 * expected**0.5, (result["requests"], expected)


def test_expected_arrivals_follow_the_diurnal_curve_and_the_hotspots(small: dict[str, Any]) -> None:
    from services.planet.demand import Demand

    small["duration_s"] = 100
    small["traffic"]["rate_per_s"] = 10
    small["traffic"]["diurnal"] = [1] * 24
    flat = Demand(build(small, source="s.yaml", base=ROOT), {}).expected_arrivals()
    small["events"] = [{"kind": "hotspot", "at_s": 50, "duration_s": 10, "factor": 11}]
    hot = Demand(build(small, source="s.yaml", base=ROOT), {}).expected_arrivals()
    assert flat == pytest.approx(1000)
    assert hot == pytest.approx(2000)  # every site x 11 for 10 of the 100 s: 10 x 10/s x 10 more
    small["traffic"]["diurnal"] = [1] * 12 + [3] * 12
    curved = Demand(build(small, source="s.yaml", base=ROOT), {})
    assert curved.expected_arrivals() != pytest.approx(hot, rel=0.01)
    exact = curved.expected_arrivals()
    assert curved.expected_arrivals(max_pieces=7) == pytest.approx(exact, rel=0.5)


def test_a_run_without_requests_writes_standard_json_and_combines(
    tmp_path: Path, small: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    for site in small["world"]["sites"]:
        site["population_m"] = 0  # nobody lives there: no request arrives
    path = write_small(tmp_path, {**small, "duration_s": 3})
    out = tmp_path / "out"
    assert main(["--scenario", str(path), "--no-progress", "--out", str(out)]) == 0
    assert "warning: " in capsys.readouterr().err
    text = (out / "results.json").read_text()

    def refuse(token: str) -> float:
        raise AssertionError(f"not standard JSON: {token}")

    result = json.loads(text, parse_constant=refuse)  # NaN / Infinity are not JSON
    assert result["requests"] == 0
    assert result["goodput"] is None
    assert result["ttft_ms"]["p99"] is None
    assert main(["--combine", str(out / "results.json"), "--out", str(tmp_path / "c")]) == 0
    assert "| – ms |" in (tmp_path / "c/report.md").read_text()
    assert json.loads((tmp_path / "c/results.json").read_text()) == result


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda d: d["traffic"]["tenants"].append(dict(d["traffic"]["tenants"][0])),
            ("traffic.tenants[2].name: tenant 'a' listed twice",),
        ),
        (
            lambda d: d["traffic"]["mixes"].append(dict(d["traffic"]["mixes"][0])),
            ("traffic.mixes[1].name: mix 'chat' listed twice",),
        ),
        (
            lambda d: d.update(name="x\n\x00"),
            ("name: must be one line of printable text, at most 200 characters: 'x\\n\\x00'",),
        ),
        (
            lambda d: d["world"]["sites"][0].update(population_m=1e308),
            ("world.sites[0].population_m: must be >= 0 and <= 1000, got 1e+308",),
        ),
        (
            lambda d: d.update(sites=["seoul", "tokyo", "seoul"]),
            ("sites: site 'seoul' listed twice",),
        ),
        (
            lambda d: d.update(
                network={
                    "links": [
                        {"site": "seoul", "region": "kr", "rtt_ms": 5},
                        {"site": "seoul", "region": "kr", "rtt_ms": 50},
                    ]
                }
            ),
            ("network.links[1]: the link seoul - kr is listed twice",),
        ),
        (
            lambda d: d.update(network={"path_stretch": 1e300, "overhead_ms": 5000}),
            (
                "network.path_stretch: must be >= 1 and <= 10, got 1e+300",
                "network.overhead_ms: must be >= 0 and <= 1000, got 5000",
            ),
        ),
        (
            lambda d: d.update(
                network={"links": [{"site": "seoul", "region": "kr", "rtt_ms": 1e9}]}
            ),
            ("network.links[0].rtt_ms: must be > 0 and <= 60000, got 1000000000.0",),
        ),
        (
            lambda d: d.update(
                events=[
                    {
                        "kind": "link-degraded",
                        "site": "seoul",
                        "region": "kr",
                        "at_s": 1,
                        "extra_rtt_ms": 1e300,
                    }
                ]
            ),
            ("events[0].extra_rtt_ms: must be >= 0 and <= 60000, got 1e+300",),
        ),
        (  # the groups that use the refused gpu are not "unknown gpu" problems besides
            lambda d: d["fleet"]["gpus"]["small"].update(kv_cache_tokens=16),
            (
                "fleet.gpus.small.kv_cache_tokens: the KV cache (16 tokens in whole blocks) "
                "must hold one full context (max_model_len=8192)",
            ),
        ),
    ],
)
def test_a_bad_scenario_gets_exactly_its_own_problems(
    small: dict[str, Any], edit: Any, expected: tuple[str, ...]
) -> None:
    edit(small)
    assert problems(small) == expected


def test_a_trace_with_rate_or_mixes_beside_it_names_what_it_would_ignore(
    tmp_path: Path, small: dict[str, Any]
) -> None:
    import json

    (tmp_path / "trace.jsonl").write_text(json.dumps(GOOD_RECORD) + "\n")
    small["traffic"]["trace"] = "trace.jsonl"  # beside rate_per_s, mixes and tenants
    found = problems_at(small, tmp_path)
    why = "not used with a trace (its records say when, where and what)"
    assert found == tuple(f"traffic.{k}: {why}" for k in ("rate_per_s", "mixes", "tenants"))


def test_ctrl_c_stops_the_run_and_writes_the_report_of_what_ran(
    tmp_path: Path, small: dict[str, Any]
) -> None:
    import json
    import signal
    import time

    path = write_small(tmp_path, {**small, "duration_s": 100_000})  # far longer than the test
    out = tmp_path / "out"
    proc = start_module("bench.planet", "--scenario", str(path), "--out", str(out),
                        "--profiles", "default", "round-robin", "--no-progress")  # fmt: skip
    assert proc.stderr is not None
    header = proc.stderr.readline()  # printed once the scenario is loaded and checked
    assert "requests per profile" in header
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted at " in stderr
    assert "round-robin" not in stdout  # the next profile did not start
    result = json.loads((out / "results.json").read_text())
    stopped = result["run"]["interrupted_at_s"]
    assert 0 < stopped < 100_000
    assert result["requests"] > 0
    assert "**Interrupted** (Ctrl-C) at" in (out / "report.md").read_text()


REGIONS_HEADER = "provider,code,city,lat,lon,zone\n"
WORD = "must be one word of at most 64 printable characters, got"
RESERVED = "is reserved (a tenant's residency uses it), choose another zone name"


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        ("", "line 1: a header and no rows"),
        ("aws,,Seoul,37.5,127,kr\n", "line 2: code must not be empty"),
        ("aws,kr\x00,Seoul,37.5,127,kr\n", f"line 2: code {WORD} 'kr\\x00'"),
        ("aws,k r,Seoul,37.5,127,kr\n", f"line 2: code {WORD} 'k r'"),
        ("aws,kr,Seoul,37.5,127,\n", "line 2: zone must not be empty"),
        ("aws,kr,Seoul,37.5,127,local\n", f"line 2: zone 'local' {RESERVED}"),
        ("aws,kr,Seoul,37.5,127,any\n", f"line 2: zone 'any' {RESERVED}"),
    ],
)
def test_a_region_table_with_a_name_that_cannot_key_anything_is_refused_naming_the_line(
    tmp_path: Path, small: dict[str, Any], rows: str, problem: str
) -> None:
    (tmp_path / "regions.csv").write_text(REGIONS_HEADER + rows)
    small["world"]["regions"] = "regions.csv"
    assert problems_at(small, tmp_path) == (f"world ({tmp_path / 'regions.csv'}): {problem}",)


def test_a_region_table_a_spreadsheet_saved_with_a_byte_order_mark_is_read(
    tmp_path: Path, small: dict[str, Any]
) -> None:
    table = REGIONS_HEADER + "".join(
        f"custom,{r['code']},{r['code']},{r['lat']},{r['lon']},{r['zone']}\n"
        for r in small["world"]["regions"]
    )
    (tmp_path / "regions.csv").write_text("\ufeff" + table, encoding="utf-8")
    small["world"]["regions"] = "regions.csv"
    sc = build(small, source="s.yaml", base=tmp_path)
    assert sorted(sc.regions) == ["jp", "kr", "us"]


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (
            lambda d: d["world"]["regions"][0].update(code="k|r"),
            "world.regions[0].code: must be one word of at most 64 printable characters",
        ),
        (
            lambda d: d["world"]["sites"][0].update(zone="local"),
            "world.sites[0].zone: 'local' is reserved",
        ),
        (
            lambda d: d["world"]["sites"][1].update(name="tok\nyo"),
            "world.sites[1].name: must be one word",
        ),
    ],
)
def test_an_inline_world_name_that_cannot_key_anything_is_refused(
    small: dict[str, Any], edit: Any, problem: str
) -> None:
    edit(small)
    found = problems(small)
    assert any(p.startswith(problem) for p in found), found


def test_combine_refuses_results_of_different_scenarios_or_lengths(
    tmp_path: Path, small: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    short = tmp_path / "short"
    path = write_small(tmp_path, {**small, "duration_s": 2})
    assert main(["--scenario", str(path), "--no-progress", "--out", str(short)]) == 0
    longer = tmp_path / "longer"
    argv = ["--scenario", str(path), "--no-progress", "--out", str(longer), "--duration", "3"]
    assert main(argv) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["--combine", str(short / "results.json"), str(longer / "results.json"),
              "--out", str(tmp_path / "both")])  # fmt: skip
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--combine: the results are of different runs, not comparable: small (" in err
    assert "2 s, fast); small (" in err
    assert not (tmp_path / "both").exists()


def test_profiles_side_by_side_give_the_results_they_give_one_after_another(
    tmp_path: Path, small: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = write_small(tmp_path, {**small, "duration_s": 3})
    profiles = ["--profiles", "default", "round-robin", "power-of-two"]
    for jobs in ("1", "3"):
        out = tmp_path / f"jobs{jobs}"
        argv = ["--scenario", str(path), "--no-progress", "--out", str(out), "--jobs", jobs]
        assert main([*argv, *profiles]) == 0
    err = capsys.readouterr().err
    assert "--jobs 3 runs them side by side" in err  # the hint, on the sequential run
    one, three = (json.loads((tmp_path / f"jobs{j}/results.json").read_text()) for j in "13")
    assert [r["profile"] for r in three] == ["default", "round-robin", "power-of-two"]
    for a, b in zip(one, three, strict=True):
        a.pop("run")
        b.pop("run")
        assert a == b  # each run is deterministic, wherever it runs


def test_side_by_side_runs_that_would_not_fit_in_memory_run_one_after_another(
    tmp_path: Path, small: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # the estimate is ~122 MiB: two fit in 250, three do not
    path = write_small(tmp_path, {**small, "duration_s": 2, "limits": {"max_memory_mib": 250}})
    argv = ["--scenario", str(path), "--no-progress", "--out", str(tmp_path / "o"), "--jobs", "3",
            "--profiles", "default", "round-robin", "power-of-two"]  # fmt: skip
    assert main(argv) == 0
    assert "would not fit in memory (limit 250 MiB); running 2 side by side" in (
        capsys.readouterr().err
    )


def test_ctrl_c_stops_profiles_side_by_side_and_reports_what_ran(
    tmp_path: Path, small: dict[str, Any]
) -> None:
    import json
    import signal
    import time

    path = write_small(tmp_path, {**small, "duration_s": 100_000})
    out = tmp_path / "out"
    proc = start_module("bench.planet", "--scenario", str(path), "--out", str(out),
                        "--profiles", "default", "round-robin", "--jobs", "2",
                        "--no-progress")  # fmt: skip
    assert proc.stderr is not None
    assert "requests per profile" in proc.stderr.readline()
    time.sleep(6.0)  # the children start (spawn: ~1 s of imports) and run
    proc.send_signal(signal.SIGINT)  # the parent only: it tells the children
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    results = json.loads((out / "results.json").read_text())
    assert [r["profile"] for r in results] == ["default", "round-robin"]
    assert all(0 < r["run"]["interrupted_at_s"] < 100_000 for r in results)
    assert stderr.count("the report covers what ran") == 2


def test_a_profile_process_killed_side_by_side_is_one_error_line(
    tmp_path: Path, small: dict[str, Any]
) -> None:
    import os
    import signal
    import time

    path = write_small(tmp_path, {**small, "duration_s": 100_000})
    proc = start_module("bench.planet", "--scenario", str(path), "--out", str(tmp_path / "o"),
                        "--profiles", "default", "round-robin", "--jobs", "2",
                        "--no-progress")  # fmt: skip
    assert proc.stderr is not None
    assert "requests per profile" in proc.stderr.readline()
    time.sleep(6.0)  # the children start (spawn) and run
    workers = [
        d.name
        for d in Path("/proc").iterdir()
        if d.name.isdigit()
        and _parent_pid(d) == proc.pid
        and "spawn_main" in (d / "cmdline").read_text(errors="replace")
    ]
    assert workers
    os.kill(int(workers[0]), signal.SIGKILL)  # what the kernel's OOM killer does
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert "error: a profile's process died before it finished (killed: out of memory?" in stderr


def _parent_pid(proc_dir: Path) -> int:
    try:  # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
