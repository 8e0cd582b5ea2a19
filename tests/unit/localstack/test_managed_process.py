"""A child that fails to start is reported with *its own* last lines: the log file is appended
to across runs, and an old run's traceback must not pass for this one's error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from services.localstack.procs import ManagedProcess, ProcessFailed
from services.localstack.stack import _check_redis


def child(tmp_path: Path, message: str) -> ManagedProcess:
    code = f"import sys; print({message!r}, file=sys.stderr); sys.exit(3)"
    return ManagedProcess(
        name="child",
        argv=[sys.executable, "-c", code],
        log_path=tmp_path / "child.log",
        ready_file=tmp_path / "child.ready",
    )


async def test_a_failed_start_shows_only_this_runs_output(tmp_path: Path) -> None:
    first = child(tmp_path, "old failure from an earlier run")
    await first.start()
    with pytest.raises(ProcessFailed):
        await first.wait_ready(10)

    second = child(tmp_path, "error: cannot listen on 127.0.0.1:8080")
    await second.start()
    with pytest.raises(ProcessFailed) as failed:
        await second.wait_ready(10)
    message = str(failed.value)
    assert "child exited with code 3" in message
    assert "cannot listen on 127.0.0.1:8080" in message
    assert "earlier run" not in message
    assert "earlier run" in (tmp_path / "child.log").read_text()  # history is kept


async def test_a_redis_url_that_does_not_answer_stops_the_stack_with_its_password_hidden() -> None:
    with pytest.raises(
        ProcessFailed, match=r"REDIS_URL redis://:\*\*\*@127\.0\.0\.1:1 does not answer"
    ):
        await _check_redis("redis://:hunter2@127.0.0.1:1")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("garbage", r"REDIS_URL 'garbage': expected redis://HOST:PORT/DB"),
        (
            "redis+sentinel://u:hunter2@127.0.0.1:1/main",
            r"REDIS_URL redis\+sentinel://u:\*\*\*@127\.0\.0\.1:1/main does not answer: no "
            r"sentinel answered",
        ),
        (
            "redis+cluster://127.0.0.1:1",
            r"REDIS_URL redis\+cluster://127\.0\.0\.1:1 does not answer: Redis Cluster cannot be",
        ),
    ],
)
async def test_every_redis_url_the_edge_takes_is_checked_as_the_edge_would_connect(
    url: str, problem: str
) -> None:
    """Sentinel and Cluster URLs are the edge's own (redisconn); redis-py's from_url refused
    them with a traceback, as it did a URL without a scheme."""
    with pytest.raises(ProcessFailed, match=problem) as failed:
        await _check_redis(url)
    assert "hunter2" not in str(failed.value)


@pytest.mark.parametrize(
    ("engine", "where"), [("sim", "regions.<name>.workers"), ("vllm", "vllm.regions")]
)
async def test_a_stack_config_that_starts_no_worker_is_refused_before_anything_starts(
    tmp_path: Path, engine: str, where: str
) -> None:
    """It used to start Redis and every worker (none), then die on the router's usage text,
    naming flags the operator never typed."""
    from services.localstack.config import parse_stack_config
    from services.localstack.stack import LocalStack

    config = parse_stack_config({"regions": {"kr": {"rtt_ms": 5, "workers": 0}}})
    stack = LocalStack(config=config, run_dir=tmp_path / "run", engine=engine)
    with pytest.raises(ProcessFailed, match=rf"starts no {engine} worker: .*\({where}\)"):
        await stack.start()
    assert not (tmp_path / "run" / "redis").exists()
