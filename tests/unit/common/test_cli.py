"""The argument types every service shares: a bad value is argparse's one-line error."""

from __future__ import annotations

import argparse
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
