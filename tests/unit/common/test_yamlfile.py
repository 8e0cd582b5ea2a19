"""Every YAML a stranger hands Meridian is bounded: depth, and size once aliases expand."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.common import yamlfile

#: Nine anchors, each a list of nine uses of the one before: 1 KB, 387,420,489 values.
BOMB = "\n".join(
    ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    + [
        f"{n}: &{n} [" + ", ".join([f"*{p}"] * 9) + "]"
        for p, n in zip("abcdefgh", "bcdefghi", strict=True)
    ]
)


def test_plain_documents_load_as_yaml_safe_load_loads_them() -> None:
    text = "name: planet\nregions: [kr, jp]\nshared: &s {a: 1}\nagain: *s\n"
    assert yamlfile.safe_load(text) == yaml.safe_load(text)


def test_an_alias_bomb_is_refused_as_invalid_yaml_in_bounded_time() -> None:
    with pytest.raises(yaml.YAMLError, match="expands to more than 1,000,000 values"):
        yamlfile.safe_load(BOMB)


def test_a_document_nested_past_the_recursion_limit_is_invalid_yaml() -> None:
    with pytest.raises(yaml.YAMLError, match="nested too deeply"):
        yamlfile.safe_load("[" * 100_000)
    with pytest.raises(yaml.YAMLError, match="nested too deeply"):
        yamlfile.safe_load("- " * 100_000 + "x")


@pytest.mark.parametrize("content", [BOMB, "[" * 100_000])
def test_every_yaml_entry_point_names_the_file_instead_of_a_traceback(
    tmp_path: Path, content: str
) -> None:
    from services.localstack.config import StackConfigError, load_stack_config
    from services.planet.errors import ScenarioError
    from services.planet.scenario import load_scenario
    from services.router.scheduling.profile import ProfileError, load_profile
    from services.worker.engine import EngineConfigError
    from services.worker.main import build_parser
    from services.worker.sim.options import from_args

    path = tmp_path / "doc.yaml"
    path.write_text(content)
    with pytest.raises(ScenarioError, match="invalid YAML"):
        load_scenario(path)
    with pytest.raises(ProfileError, match="invalid YAML"):
        load_profile(path)
    with pytest.raises(StackConfigError, match="invalid YAML"):
        load_stack_config(path)
    args = build_parser().parse_args(
        ["--worker-id", "w", "--region", "r", "--sim-config", str(path)]
    )
    with pytest.raises(EngineConfigError, match="invalid YAML"):
        from_args(args)
    args = build_parser().parse_args(["--worker-id", "w", "--region", "r", "--sim", f"x={content}"])
    with pytest.raises(EngineConfigError, match="cannot parse value"):
        from_args(args)
