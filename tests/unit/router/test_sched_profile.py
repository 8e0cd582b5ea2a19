"""Profiles as data: loading, and validation errors that name their location."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from services.router.scheduling.framework import SchedulerProfile
from services.router.scheduling.profile import ProfileError, load_profile, load_profiles
from services.router.scheduling.registry import BUILTIN_PLUGINS, PluginRegistry, default_registry

PROFILES = Path(__file__).resolve().parents[3] / "deploy/router/profiles"

VALID: dict[str, Any] = {
    "profiles": {
        "default": {
            "filters": [
                {"type": "residency"},
                {"type": "model-ready"},
                {"type": "capability"},
                {"type": "healthy"},
            ],
            "scorers": [
                {"type": "latency", "weight": 3, "params": {"tau_ms": 40}},
                {"type": "queue", "weight": 2},
                {"type": "kv-cache", "weight": 1},
            ],
            "picker": {"type": "max-score", "params": {"max_candidates": 2}},
        }
    }
}


def edited(path: list[Any], value: Any) -> dict[str, Any]:
    """VALID with one value replaced (or deleted when ``value`` is ...)."""
    doc = copy.deepcopy(VALID)
    node: Any = doc
    for step in path[:-1]:
        node = node[step]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def problems(doc: Any) -> tuple[str, ...]:
    with pytest.raises(ProfileError) as err:
        load_profiles(doc)
    return err.value.problems


@pytest.mark.parametrize(
    "name",
    ["default", "default-spread", "round-robin", "nearest-region", "least-loaded", "power-of-two"],
)
def test_shipped_profiles_load(name: str) -> None:
    scheduler = load_profile(PROFILES / f"{name}.yaml")
    assert isinstance(scheduler, SchedulerProfile)
    assert scheduler.name == name


def test_a_valid_mapping_builds_a_scheduler_with_its_plugins_and_weights() -> None:
    s = load_profile(VALID)
    assert [f.TYPE for f in s.filters] == ["residency", "model-ready", "capability", "healthy"]
    assert [(ws.scorer.TYPE, ws.weight) for ws in s.scorers] == [
        ("latency", 3.0),
        ("queue", 2.0),
        ("kv-cache", 1.0),
    ]
    assert s.picker.TYPE == "max-score"


PROBLEMS: list[tuple[str, Any, str]] = [
    (
        "unknown plugin",
        edited(["profiles", "default", "scorers", 2, "type"], "gpus"),
        "profiles[default].scorers[2]: unknown plugin 'gpus' (known scorers: gpu, kv-cache,",
    ),
    (
        "zero weight",
        edited(["profiles", "default", "scorers", 0, "weight"], 0),
        "profiles[default].scorers[0].weight: must be > 0",
    ),
    (
        "missing weight",
        edited(["profiles", "default", "scorers", 1, "weight"], ...),
        "profiles[default].scorers[1].weight: required (a scorer without a weight is an error)",
    ),
    (
        "weight not a number",
        edited(["profiles", "default", "scorers", 1, "weight"], "heavy"),
        "profiles[default].scorers[1].weight: must be a number",
    ),
    (
        "unknown parameter",
        edited(["profiles", "default", "scorers", 0, "params"], {"tau": 40}),
        "profiles[default].scorers[0].params.tau: unknown parameter "
        "(known parameters: tau_ms, unknown_score)",
    ),
    (
        "parameter of the wrong type",
        edited(["profiles", "default", "scorers", 0, "params"], {"tau_ms": "40ms"}),
        "profiles[default].scorers[0].params.tau_ms: must be a number, not the string '40ms'",
    ),
    (
        "parameter out of range",
        edited(["profiles", "default", "scorers", 0, "params"], {"tau_ms": -1}),
        "profiles[default].scorers[0].params.tau_ms: must be > 0",
    ),
    (
        "nested parameter",
        edited(
            ["profiles", "default", "filters", 2],
            {"type": "admission", "params": {"thresholds": {"low": 0}}},
        ),
        "profiles[default].filters[2].params.thresholds.low: must be > 0",
    ),
    (
        "tiers out of order",
        edited(
            ["profiles", "default", "filters", 2],
            {"type": "admission", "params": {"regions": {"ap": {"low": 0.99}}}},
        ),
        "profiles[default].filters[2].params.regions.ap: must satisfy low <= standard <= high",
    ),
    (
        "a filter used as a scorer",
        edited(["profiles", "default", "scorers", 1], {"type": "healthy", "weight": 1}),
        "profiles[default].scorers[1]: 'healthy' is a filter, not a scorer",
    ),
    (
        "a weight on a filter",
        edited(["profiles", "default", "filters", 2, "weight"], 2),
        "profiles[default].filters[2]: unknown key 'weight' (expected: type, params) (only scorers",
    ),
    (
        "duplicate plugin",
        edited(["profiles", "default", "scorers", 2], {"type": "latency", "weight": 1}),
        "profiles[default].scorers[2]: duplicate plugin 'latency' (each may appear once)",
    ),
    (
        "missing type",
        edited(["profiles", "default", "scorers", 2], {"weight": 1}),
        "profiles[default].scorers[2].type: required",
    ),
    (
        "missing picker",
        edited(["profiles", "default", "picker"], ...),
        "profiles[default].picker: required",
    ),
    (
        "unknown profile key",
        edited(["profiles", "default", "scorer"], []),
        "profiles[default]: unknown key 'scorer' (expected: filters, scorers, picker,",
    ),
    (
        "residency is required",
        edited(["profiles", "default", "filters", 0], {"type": "exclude"}),
        "profiles[default].filters: missing required filter 'residency'",
    ),
    (
        "capability is required",
        edited(["profiles", "default", "filters", 2], {"type": "exclude"}),
        "profiles[default].filters: missing required filter 'capability' "
        "(a hard constraint, never optional)",
    ),
    (
        "filters not a list",
        edited(["profiles", "default", "filters"], "healthy"),
        "profiles[default].filters: must be a list",
    ),
    (
        "filters a number",
        edited(["profiles", "default", "filters"], 7),
        "profiles[default].filters: must be a list",
    ),
    ("no profiles", {"profiles": {}}, "profiles: must be a non-empty mapping"),
    (
        "memoised filter after a plain one",
        edited(
            ["profiles", "default", "filters"],
            [
                {"type": "residency"},
                {"type": "capability"},
                {"type": "exclude"},
                {"type": "model-ready"},
            ],
        ),
        "profiles[default].filters[3]: memoised filter 'model-ready' must be listed before "
        "the plain filter at filters[2] ('exclude')",
    ),
    (
        "bad retry hint",
        edited(["profiles", "default", "unavailable_retry_after_s"], -1),
        "profiles[default].unavailable_retry_after_s: must be a number >= 0",
    ),
]


@pytest.mark.parametrize(("case", "doc", "message"), PROBLEMS, ids=[p[0] for p in PROBLEMS])
def test_validation_errors_name_their_location(case: str, doc: Any, message: str) -> None:
    found = problems(doc)
    assert any(p.startswith(message) for p in found), found


def test_every_problem_is_reported_at_once() -> None:
    doc = edited(
        ["profiles", "default", "scorers"],
        [{"type": "gpus", "weight": 1}, {"type": "queue", "weight": -2}],
    )
    doc["profiles"]["other"] = {"filters": [], "picker": {"type": "max-score"}}
    found = problems(doc)
    assert found == (
        "profiles[default].scorers[0]: unknown plugin 'gpus' "
        "(known scorers: gpu, kv-cache, latency, "
        "load, loss, prefix-affinity, queue, region-proximity, session-affinity, throughput)",
        "profiles[default].scorers[1].weight: must be > 0",
        "profiles[other].filters: missing required filter 'model-ready' "
        "(a hard constraint, never optional)",
        "profiles[other].filters: missing required filter 'residency' "
        "(a hard constraint, never optional)",
        "profiles[other].filters: missing required filter 'capability' "
        "(a hard constraint, never optional)",
    )
    with pytest.raises(ProfileError, match=r"<mapping>: 5 problems:\n  profiles\[default\]"):
        load_profiles(doc)


def test_files_report_their_path_and_yaml_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("profiles: [unclosed\n")
    with pytest.raises(ProfileError, match=r"broken\.yaml: invalid YAML"):
        load_profile(broken)
    with pytest.raises(ProfileError, match=r"missing\.yaml: cannot read"):
        load_profile(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\xff\xfe", "not UTF-8 text (byte 0xff at offset 0)"),
        (b"profiles: {}\n\xe9t\xe9", "not UTF-8 text (byte 0xe9 at offset 13)"),
        (None, "Is a directory"),
    ],
)
def test_a_profile_file_that_is_not_utf8_text_is_a_profile_error(
    tmp_path: Path, content: bytes | None, reason: str
) -> None:
    path = tmp_path / "p.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert str(err.value) == f"{path}: cannot read: {reason}"


def test_a_document_that_is_not_a_mapping_is_rejected(tmp_path: Path) -> None:
    listed = tmp_path / "list.yaml"
    listed.write_text("- profiles\n")
    with pytest.raises(ProfileError) as err:
        load_profile(listed)
    assert err.value.problems == ("(document): must be a mapping with a 'profiles' key",)


def test_choosing_a_profile_by_name() -> None:
    doc = copy.deepcopy(VALID)
    doc["profiles"]["alt"] = copy.deepcopy(doc["profiles"]["default"])
    assert load_profile(doc).name == "default"
    assert load_profile(doc, name="alt").name == "alt"
    with pytest.raises(ProfileError, match="no profile named 'nope'"):
        load_profile(doc, name="nope")
    del doc["profiles"]["default"]
    doc["profiles"]["alt2"] = copy.deepcopy(doc["profiles"]["alt"])
    with pytest.raises(ProfileError, match="several profiles"):
        load_profile(doc)


def test_registry_names_are_unique_across_extension_points() -> None:
    registry = default_registry()
    assert registry.names("picker") == (
        "max-score",
        "power-of-two",
        "round-robin",
        "weighted-random",
    )
    with pytest.raises(ValueError, match="registered twice"):
        PluginRegistry([*BUILTIN_PLUGINS, BUILTIN_PLUGINS[0]])
