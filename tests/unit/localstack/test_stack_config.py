"""``python -m services.localstack``'s inputs: the stack config (read as UTF-8 text, every
number finite) and the state folder are refused before anything starts, in one line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.localstack.config import StackConfigError, load_stack_config, parse_stack_config
from services.localstack.main import build_parser, main

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _never_start_the_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    """A config these tests expect refused but that passes must fail the test, not start
    Redis, workers and an edge."""

    def run(*_: object) -> None:
        raise AssertionError("the stack would have started")

    monkeypatch.setattr("services.localstack.main.runtime.run", run)


def _stack(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "stack.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\xff\xfe", "not UTF-8 text (byte 0xff at offset 0)"),
        (b"site: s\xe9oul\n", "not UTF-8 text (byte 0xe9 at offset 7)"),
        (None, "No such file or directory"),
        ("dir", "Is a directory"),
    ],
)
def test_a_config_that_cannot_be_read_is_refused_naming_the_flag_and_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | str | None, reason: str
) -> None:
    path = tmp_path / "stack.yaml"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(StackConfigError) as refused:
        load_stack_config(path)
    assert str(refused.value) == f"{path}: {reason}"
    with pytest.raises(SystemExit) as exc:
        main(["--config", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: --config: {path}: {reason}\n" in err
    assert "Traceback" not in err


def _region(**spec: Any) -> dict[str, Any]:
    return {"regions": {"kr": {"rtt_ms": 4, **spec}}}


@pytest.mark.parametrize(
    ("yaml_text", "error"),
    [
        ("regions: {kr: {rtt_ms: .nan}}", r"regions\.kr\.rtt_ms: must be a finite number >= 0"),
        ("regions: {kr: {rtt_ms: .inf}}", r"regions\.kr\.rtt_ms: must be a finite number >= 0"),
        ("regions: {kr: {rtt_ms: -.inf}}", r"regions\.kr\.rtt_ms: must be a finite number >= 0"),
        ("regions: {kr: {rtt_ms: 4, jitter_ms: .nan}}", r"regions\.kr\.jitter_ms"),
        ("regions: {kr: {rtt_ms: 4, jitter_ms: .inf}}", r"regions\.kr\.jitter_ms"),
        ("regions: {kr: {rtt_ms: 4, location: [.nan, 0]}}", r"regions\.kr\.location"),
        ("{site_location: [0, .inf], regions: {kr: {rtt_ms: 4}}}", "site_location"),
        (
            "{regions: {kr: {rtt_ms: 4}}, vllm: {options: {gpu_memory_utilization: .nan}}}",
            r"vllm\.options\.gpu_memory_utilization: must be a finite number",
        ),
        (
            "{regions: {kr: {rtt_ms: 4}}, vllm: {options: {max_model_len: .inf}}}",
            r"vllm\.options\.max_model_len: must be a finite number",
        ),
        ("{regions: {kr: {rtt_ms: 4}}, sim: {time_scale: .nan}}", "sim: .*'time_scale'"),
        ("{regions: {kr: {rtt_ms: 4}}, sim: {decode_base_ms: .inf}}", "sim: .*'decode_base_ms'"),
        ("{regions: {kr: {rtt_ms: 4}}, sim: {no_such_knob: 1}}", "sim: .*'no_such_knob'"),
    ],
)
def test_numbers_that_are_not_finite_are_refused_where_they_are(
    tmp_path: Path, yaml_text: str, error: str
) -> None:
    with pytest.raises(StackConfigError, match=error):
        load_stack_config(_stack(tmp_path, yaml_text))


def test_a_nan_rtt_stops_the_command_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _stack(tmp_path, "regions: {kr: {rtt_ms: .nan}}")
    with pytest.raises(SystemExit) as exc:
        main(["--config", str(path)])
    assert exc.value.code == 2
    assert "--config: regions.kr.rtt_ms: must be a finite number >= 0, got nan" in (
        capsys.readouterr().err
    )


def test_finite_numbers_and_the_shipped_config_are_accepted() -> None:
    config = parse_stack_config(
        {
            "regions": {"kr": {"rtt_ms": 4, "jitter_ms": 0.5, "location": [36.35, 127.38]}},
            "sim": {"time_scale": 0.5},
            "vllm": {"options": {"gpu_memory_utilization": 0.15}},
        }
    )
    assert config.regions[0].rtt_ms == 4.0
    assert config.sim == {"time_scale": 0.5}
    shipped = yaml.safe_load((REPO / "deploy/local/stack.yaml").read_text())
    assert parse_stack_config(shipped).regions


@pytest.mark.parametrize(
    ("where", "problem"),
    [
        ("file", "argument --state-dir: '.*file' is not a directory"),
        ("file/state", "argument --state-dir: cannot create '.*file/state': '.*file' is a file"),
    ],
)
def test_a_state_dir_that_cannot_be_a_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, problem: str
) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--state-dir", str(tmp_path / where)])
    assert exc.value.code == 2
    *_, last = capsys.readouterr().err.splitlines()  # the usage, then one line
    assert re.fullmatch(f"python -m services.localstack: error: {problem}", last), last


def test_a_state_dir_from_the_environment_is_checked_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default is ``$MERIDIAN_STATE_DIR`` (read at import, into ``STATE_DIR``)."""
    import services.localstack.main as localstack_main

    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(localstack_main, "STATE_DIR", tmp_path / "file")
    with pytest.raises(SystemExit) as exc:
        localstack_main.build_parser().parse_args([])
    assert exc.value.code == 2
    assert "argument --state-dir: " in capsys.readouterr().err


def test_a_state_dir_that_is_a_folder_or_can_be_made_is_accepted(tmp_path: Path) -> None:
    assert build_parser().parse_args(["--state-dir", str(tmp_path)]).state_dir == tmp_path
    new = tmp_path / "a" / "b"
    assert build_parser().parse_args(["--state-dir", str(new)]).state_dir == new
