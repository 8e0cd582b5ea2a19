"""Fixtures shared by every test: a real Redis of the tests' own (free port)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_proc import RedisProcess


@pytest.fixture(scope="session")
def redis_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_process: RedisProcess) -> str:
    """A clean Redis for each test (our own server, so flushing it is safe)."""
    redis_process.flush()
    return redis_process.url
