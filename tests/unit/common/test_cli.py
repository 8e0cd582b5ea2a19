"""The argument types every service shares: a bad value is argparse's one-line error."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from services.common import cli


def test_an_output_file_in_an_existing_directory_is_accepted(tmp_path: Path) -> None:
    assert cli.output_file(str(tmp_path / "ready.json")) == tmp_path / "ready.json"


@pytest.mark.parametrize(
    ("where", "problem"),
    [
        ("missing/ready.json", "is not an existing directory"),
        ("file/ready.json", "is not an existing directory"),  # a file
        (".", "is a directory"),
    ],
)
def test_an_output_file_that_cannot_be_written_is_refused_before_start(
    tmp_path: Path, where: str, problem: str
) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(argparse.ArgumentTypeError, match=problem):
        cli.output_file(str(tmp_path / where))


@pytest.mark.parametrize("service", ["edge", "router", "worker"])
def test_every_service_refuses_a_ready_file_it_could_not_write(
    service: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    build_parser = importlib.import_module(f"services.{service}.main").build_parser
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--ready-file", str(tmp_path / "no" / "r.json")])
    assert exc.value.code == 2
    assert "--ready-file" in capsys.readouterr().err


# --- float flags: a finite number within bounds (float() alone takes "nan" and "inf") ---


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_a_float_flag_refuses_what_is_not_finite(value: str) -> None:
    for parse in (cli.positive_float, cli.non_negative_float, cli.fraction, cli.finite_float()):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a finite number"):
            parse(value)


@pytest.mark.parametrize(
    ("parse", "value", "problem"),
    [
        (cli.positive_float, "0", "must be > 0, got 0"),
        (cli.positive_float, "-1.5", "must be > 0"),
        (cli.positive_float, "ten", "'ten' is not a number"),
        (cli.non_negative_float, "-0.1", "must be >= 0"),
        (cli.fraction, "1.01", r"must be within \[0, 1\]"),
        (cli.finite_float(0, 1, low_open=True), "0", r"must be within \(0, 1\]"),
        (cli.finite_float(60), "59", "must be >= 60"),
        (cli.finite_float(high=5), "6", "must be <= 5"),
    ],
)
def test_a_float_flag_out_of_bounds_is_refused_with_the_bounds(
    parse: Callable[[str], float], value: str, problem: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=problem):
        parse(value)


def test_a_float_flag_takes_numbers_within_bounds() -> None:
    assert cli.positive_float("0.25") == 0.25
    assert cli.non_negative_float("0") == 0.0
    assert cli.fraction("1") == 1.0
    assert cli.finite_float(60)("3600") == 3600.0


def _float_flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every option of ``parser`` (and its subcommands) that takes a float."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += [f"{sub.prog.split()[-1]} {flag}" for flag in _float_flags(sub)]
        elif action.option_strings and (
            isinstance(action.default, float) or action.dest in _FLOATS_WITHOUT_DEFAULT
        ):
            out.append(action.option_strings[0])
    return out


_FLOATS_WITHOUT_DEFAULT = {"gpu_memory_utilization"}

_REQUIRED = {
    "services.edge.main": ["--redis-url", "redis://127.0.0.1:1/0", "--router", "127.0.0.1:2"],
    "services.router.main": [],
    "services.worker.main": ["--worker-id", "w1", "--region", "kr"],
    "services.localstack.main": [],
    "services.localstack.compose.__main__": [],
}


def _service_float_flags() -> list[tuple[str, str]]:
    import importlib

    out = []
    for module in _REQUIRED:
        parser = importlib.import_module(module).build_parser()
        out += [(module, flag) for flag in _float_flags(parser)]
    return out


def test_the_float_flag_sweep_finds_the_flags_it_should() -> None:
    flags = {flag for _, flag in _service_float_flags()}
    assert {"--drain-grace-s", "--report-interval-ms", "--gpu-memory-utilization"} <= flags
    assert {"--ip-requests-per-s", "--console-session-ttl-s", "chaos --fault-s"} <= flags


@pytest.mark.parametrize(("module", "flag"), _service_float_flags())
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_float_flag_of_every_service_refuses_nan_and_inf(
    module: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    parser = importlib.import_module(module).build_parser()
    *command, option = flag.split()
    with pytest.raises(SystemExit) as exc:  # FLAG=VALUE: "-inf" alone would read as a flag
        parser.parse_args([*_REQUIRED[module], *command, f"{option}={value}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: must be a finite number, got '{value}'" in err
    assert "Traceback" not in err


# --- output folders (--state-dir, --out): writable, or creatable, before the work starts ---


def test_an_output_dir_that_exists_or_can_be_created_is_accepted(tmp_path: Path) -> None:
    assert cli.output_dir(str(tmp_path)) == tmp_path
    assert cli.output_dir(str(tmp_path / "new" / "deeper")) == tmp_path / "new" / "deeper"


@pytest.mark.parametrize(
    ("where", "problem"),
    [
        ("file", "'.*file' is not a directory"),
        ("file/x", "cannot create '.*file/x': '.*file' is a file"),
        ("file/x/y", "cannot create '.*file/x/y': '.*file' is a file"),
        ("dangling", "is a broken symbolic link"),
    ],
)
def test_an_output_dir_that_cannot_be_a_folder_is_refused(
    tmp_path: Path, where: str, problem: str
) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(argparse.ArgumentTypeError, match=problem):
        cli.output_dir(str(tmp_path / where))


@pytest.mark.parametrize("where", ["/proc/meridian-test", "/proc/meridian-test/deeper"])
def test_an_output_dir_the_kernel_refuses_is_refused_even_for_root(where: str) -> None:
    # os.access says "writable" to root for /proc; only trying tells (others: not writable)
    why = "directory '/proc' (refuses new folders|is not writable)"
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        cli.output_dir(where)


def test_an_output_file_where_the_kernel_refuses_files_is_refused_even_for_root() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="directory '/proc' is not writable"):
        cli.output_file("/proc/meridian-test.ready")


def test_checking_an_output_dir_leaves_nothing_behind(tmp_path: Path) -> None:
    assert cli.output_dir(str(tmp_path / "new" / "deeper")) == tmp_path / "new" / "deeper"
    assert cli.output_dir(str(tmp_path)) == tmp_path
    assert list(tmp_path.iterdir()) == []


def test_an_empty_output_dir_is_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a folder"):
        cli.output_dir("")


# --- files flags name: every failure one error naming the flag and the file ---


def test_read_text_reads_utf8(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes("a: ü\n".encode())
    assert cli.read_text(path) == "a: ü\n"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\xff\xfe", "not UTF-8 text (byte 0xff at offset 0)"),
        (b"ok: 1\n\xc3", "not UTF-8 text (byte 0xc3 at offset 6)"),
        (None, "No such file or directory"),
        ("dir", "Is a directory"),
        (b"x" * 11, "larger than 10 bytes"),
    ],
)
def test_read_text_names_the_flag_the_file_and_why(
    tmp_path: Path, content: bytes | str | None, reason: str
) -> None:
    path = tmp_path / "f.yaml"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(cli.UnreadableFile) as err:
        cli.read_text(path, flag="--config", max_bytes=10)
    assert str(err.value) == f"--config {path}: {reason}"
    assert err.value.reason == reason
    assert isinstance(err.value, ValueError)


def test_read_text_of_a_fifo_nothing_writes_to_returns_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "profile.yaml"
    os.mkfifo(fifo)
    assert cli.read_text(fifo) == ""  # the caller says what an empty file means


def test_read_text_reads_a_pipe_to_its_end() -> None:
    """``--profile /dev/stdin`` with a pipe that has a writer waits for the writer's end."""
    code = (
        "import sys; from services.common import cli; sys.stdout.write(cli.read_text('/dev/stdin'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], input=b"a: 1\n" * 5000, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"a: 1\n" * 5000


# --- integer flags (counts, concurrency, tokens) ---


@pytest.mark.parametrize(
    ("value", "problem"),
    [("x", "'x' is not an integer"), ("1.5", "'1.5' is not an integer"), ("0", "must be >= 1")],
)
def test_a_count_flag_refuses_what_is_not_a_positive_integer(value: str, problem: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=problem):
        cli.positive_int(value)


def test_an_integer_flag_takes_numbers_within_bounds_and_names_them_otherwise() -> None:
    assert cli.positive_int("32") == 32
    assert cli.integer(2, 200)("200") == 200
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be within \[2, 200\], got 201"):
        cli.integer(2, 200)("201")
