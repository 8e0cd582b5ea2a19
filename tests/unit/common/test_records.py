"""``@record``: frozen to the type checker (an assignment is a mypy error), a slotted value
type at run time (equal and hashable by value, ``replace`` works), and cheaper to build than
``frozen=True``."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
from mypy import api as mypy_api

from services.common.records import record
from services.router.scheduling.types import WorkerSnapshot


@record
class Point:
    x: int
    y: int = 0


def test_a_record_is_a_slotted_value_equal_and_hashable_by_its_fields() -> None:
    a, b = Point(1, 2), Point(1, 2)
    assert a == b
    assert hash(a) == hash(b)
    assert {a: "p"}[b] == "p"
    assert dataclasses.replace(a, y=3) == Point(1, 3)
    assert not hasattr(a, "__dict__")
    with pytest.raises(AttributeError):
        a.z = 1  # type: ignore[attr-defined]  # slots: no new attributes either


def test_mypy_refuses_an_assignment_to_a_field_as_for_a_frozen_dataclass(
    tmp_path: Path,
) -> None:
    source = tmp_path / "uses_record.py"
    source.write_text(
        textwrap.dedent(
            """
            from services.common.records import record
            from services.router.scheduling.types import WorkerSnapshot

            @record
            class Point:
                x: int

            Point(1).x = 2
            WorkerSnapshot(worker_id="w", region="r", address="a").running = 3
            """
        )
    )
    out, _, status = mypy_api.run(
        [str(source), "--no-incremental", "--follow-imports=silent", "--no-error-summary"]
    )
    assert status == 1, out
    assert out.count("is read-only") == 2, out


def test_a_snapshot_is_built_without_frozens_per_field_setattr() -> None:
    """Not a timing: no frozen ``__setattr__`` is defined, so ``__init__`` assigns each field
    directly (the module docstring's 10x)."""
    assert WorkerSnapshot.__setattr__ is object.__setattr__
