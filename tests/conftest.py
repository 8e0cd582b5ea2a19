"""Fixtures shared by every test: a real Redis of the tests' own (free port)."""

from __future__ import annotations

import logging
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


@pytest.fixture(autouse=True)
def restore_root_logging() -> Iterator[None]:
    """A test that runs a service's ``main()`` gets ``logs.configure``'s handler on the root
    logger, bound to that test's captured stderr; put the root logger back afterwards, or every
    later log line fails with "I/O operation on closed file"."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
