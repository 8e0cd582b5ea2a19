"""Worker engine flags are checked before anything loads: a bad one stops start-up with a
message naming it (and for vLLM, before the multi-gigabyte import)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.worker.engine import EngineConfigError
from services.worker.engine_factory import build_engine
from services.worker.main import build_parser, main

BASE = ["--worker-id", "w1", "--region", "kr", "--engine", "vllm"]


def test_a_model_path_that_does_not_exist_is_refused_by_name(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(EngineConfigError, match=f"--model {missing}: no such model folder"):
        build_engine(build_parser().parse_args([*BASE, "--model", str(missing)]))


def test_a_folder_without_a_model_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="not a model folder"):
        build_engine(build_parser().parse_args([*BASE, "--model", str(tmp_path)]))


def test_vllm_needs_a_model() -> None:
    with pytest.raises(EngineConfigError, match="--model is required"):
        build_engine(build_parser().parse_args(BASE))


def test_a_bad_engine_flag_ends_start_up_with_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*BASE, "--model", str(tmp_path / "missing")])
    assert exited.value.code == 2
    assert "no such model folder" in capsys.readouterr().err


def _model(tmp_path: Path) -> str:
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice: .*needs a tool_call_parser"),
        (["--speculative-config", "{ngram"], "--speculative-config: not JSON"),
        (["--speculative-config", "[1]"], "--speculative-config: must be a JSON object"),
        (["--speculative-config", "[" * 100_000], "--speculative-config: not usable JSON"),
        (["--speculative-config", "9" * 5000], "--speculative-config: not usable JSON"),
        (
            ["--speculative-config", '{"tokens": 3}'],
            "--speculative-config: .*'method' or a 'model'",
        ),
        (
            ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 0}'],
            "--speculative-config: .*num_speculative_tokens",
        ),
        (["--structured-outputs-backend", "regexes"], "--structured-outputs-backend: .*one of"),
        (["--structured-outputs-compact"], "--structured-outputs-compact: .*xgrammar or guidance"),
        (["--max-choices", "0"], "--max-choices: .*at least 1"),
        (["--quantization", " "], "--quantization: .*blank"),
    ],
)
def test_engine_option_flags_are_checked_by_name_before_vllm_loads(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    with pytest.raises(EngineConfigError, match=message):
        build_engine(build_parser().parse_args([*BASE, "--model", _model(tmp_path), *flags]))


SIM = ["--worker-id", "w1", "--region", "kr", "--engine", "sim"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\xff\xfe", "not UTF-8 text (byte 0xff at offset 0)"),
        (b"time_scale: 0.5\n\xe9", "not UTF-8 text (byte 0xe9 at offset 16)"),
        (None, "No such file or directory"),
        ("dir", "Is a directory"),
    ],
)
def test_a_sim_config_that_cannot_be_read_stops_start_up_naming_the_flag_and_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | str | None, reason: str
) -> None:
    path = tmp_path / "sim.yaml"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(SystemExit) as exited:
        main([*SIM, "--sim-config", str(path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"error: --sim-config {path}: {reason}\n" in err
    assert "Traceback" not in err


def test_a_sim_config_that_is_utf8_text_is_read(tmp_path: Path) -> None:
    path = tmp_path / "sim.yaml"
    path.write_bytes("time_scale: 0.5  # ½\n".encode())
    engine = build_engine(build_parser().parse_args([*SIM, "--sim-config", str(path)]))
    assert engine is not None


@pytest.mark.parametrize("flag", ["--drain-grace-s", "--report-interval-ms"])
@pytest.mark.parametrize("value", ["inf", "nan", "0"])
def test_timing_flags_must_be_finite_and_positive(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*SIM, flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: must be " in capsys.readouterr().err


def test_max_load_watchers_reaches_the_config_and_must_be_positive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from services.worker.main import worker_config

    args = build_parser().parse_args([*SIM, "--max-load-watchers", "16"])
    assert worker_config(args).max_load_watchers == 16
    with pytest.raises(SystemExit):
        build_parser().parse_args([*SIM, "--max-load-watchers", "0"])
    assert "argument --max-load-watchers: must be " in capsys.readouterr().err
