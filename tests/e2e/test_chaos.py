"""The chaos suite on the real process stack (bench/chaos.py's stack and faults, smaller):
for every fault, 0 failed streams, 0 tokens lost, 0 duplicated — each stream byte-identical
to the text its seed determines — and the usage of an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import SCENARIOS, run_scenario

pytestmark = pytest.mark.slow

#: Faults that break the streams' worker: those streams must have moved.
MIGRATING = {"worker-kill9", "worker-sigstop", "worker-drain", "link-cut"}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_streams_survive_the_fault_byte_for_byte(name: str, tmp_path: Path) -> None:
    row = await run_scenario(
        SCENARIOS[name], streams=6, tokens=100, fault_after_s=0.8, fault_s=2.0, run_dir=tmp_path
    )
    assert row.errors == []
    assert row.failed == 0
    assert row.lost == 0
    assert row.duplicated == 0
    assert row.usage_wrong == 0
    if name in MIGRATING:
        assert row.migrated > 0
        assert row.out_of_rotation_s is not None
