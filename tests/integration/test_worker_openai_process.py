"""``python -m services.worker --engine openai`` as a process: a bad flag is a usage error that
names it (exit 2, nothing listens), and an upstream that does not answer is reported in one log
line naming ``--upstream-url`` while the worker stays up reporting the failure."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from services.common.net import free_port
from services.localstack.stack import REPO_ROOT
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

WORKER = [sys.executable, "-m", "services.worker", "--engine", "openai", "--worker-id", "w1",
          "--region", "kr", "--port", "0"]  # fmt: skip


async def test_a_bad_upstream_flag_is_a_usage_error_naming_it() -> None:
    proc = await asyncio.create_subprocess_exec(
        *WORKER, "--upstream-url", "ftp://x/v1", cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "error: --upstream-url 'ftp://x/v1': the scheme must be http or https" in err.decode()


async def test_an_upstream_that_does_not_answer_is_one_log_line_naming_the_flag(
    tmp_path: Path,
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *WORKER, "--upstream-url", url, "--upstream-wait-s", "0.5",
            "--ready-file", str(tmp_path / "ready"), cwd=REPO_ROOT, stdout=out, stderr=out,
        )  # fmt: skip
    try:

        def failed() -> bool:
            return "worker.engine_failed" in log.read_text()

        await eventually(failed, timeout_s=60, interval_s=0.1)
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        (line,) = [x for x in lines if x["event"] == "upstream.start_failed"]
        assert line["error"].startswith(f"--upstream-url {url}: the upstream does not answer")
        assert proc.returncode is None  # still up, reporting FAILED to its routers
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
