"""Per-service environment in the local stack: each kind of service gets its own extras (the
telemetry benchmark traces the edge alone this way); a misspelt kind is an error, not a no-op."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from services.localstack.config import parse_stack_config
from services.localstack.procs import ManagedProcess
from services.localstack.stack import LocalStack

CONFIG = parse_stack_config({"regions": {"kr": {"rtt_ms": 0, "workers": 1}}})


def test_a_service_kind_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such service kind"):
        LocalStack(config=CONFIG, run_dir=tmp_path, service_env={"routers": {"X": "1"}})


async def test_each_kind_of_service_starts_with_its_own_extra_environment(
    tmp_path: Path,
) -> None:
    stack = LocalStack(
        config=CONFIG,
        run_dir=tmp_path,
        python=sys.executable,
        service_env={"router": {"OTEL_TRACES_SAMPLER": "always_off"}},
    )
    seen: dict[str, str] = {}
    for name, module in (("router", "services.router"), ("edge", "services.edge")):
        proc = stack._proc(name, module)
        probe = ManagedProcess(
            name=name,
            argv=[
                sys.executable,
                "-c",
                "import os; print(os.environ.get('OTEL_TRACES_SAMPLER', 'unset'))",
            ],
            log_path=tmp_path / f"{name}.log",
            ready_file=tmp_path / f"{name}.ready",
            env=proc._env,  # what the real service process would be given
        )
        await probe.start()
        assert probe.proc is not None
        await probe.proc.wait()
        seen[name] = (tmp_path / f"{name}.log").read_text().strip()
    assert seen == {"router": "always_off", "edge": "unset"}
