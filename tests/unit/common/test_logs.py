"""The JSON-lines log format: what the cheaper encoder and record path must keep."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator

import pytest

from services.common import logs


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The root logger configured as a service configures it, writing to a buffer."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logs.configure("test-service", "info")
    out = io.StringIO()
    handler = root.handlers[0]
    assert isinstance(handler, logs.LineHandler)
    handler.stream = out
    try:
        yield out
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])


def test_dumps_writes_what_json_dumps_writes() -> None:
    line = {
        "ts": 1796155136.880261,
        "event": "route.decided",
        "text": 'héllo\n"quoted"',
        "items": [1, 2.5, None, True],
        "nested": {"inf": float("inf")},
        "big": 10**30,
        "object": object,
    }
    assert logs.dumps(line) == json.dumps(line, default=str, separators=(",", ":"))


def test_an_event_is_one_json_line_with_its_fields(captured: io.StringIO) -> None:
    logs.event(logging.getLogger("meridian.test"), "thing.done", worker_id="w-1", score=0.5)
    (line,) = captured.getvalue().splitlines()
    record = json.loads(line)
    assert record["service"] == "test-service"
    assert record["logger"] == "meridian.test"
    assert record["level"] == "info"
    assert record["event"] == "thing.done"
    assert record["worker_id"] == "w-1"
    assert record["score"] == 0.5


def test_events_below_the_level_are_not_written(captured: io.StringIO) -> None:
    logs.event(logging.getLogger("meridian.test"), "thing.noise", logging.DEBUG, x=1)
    assert captured.getvalue() == ""


def test_a_stream_that_does_not_flush_itself_is_flushed_per_line(captured: io.StringIO) -> None:
    flushed: list[int] = []

    class Buffered(io.StringIO):
        def flush(self) -> None:
            flushed.append(len(self.getvalue()))

    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logs.LineHandler)
    handler.stream = Buffered()
    logs.event(logging.getLogger("meridian.test"), "thing.done")
    assert flushed
    assert flushed[-1] > 0


def test_a_librarys_own_handler_can_still_format_the_process(captured: io.StringIO) -> None:
    # vLLM logs through a handler of its own whose format names the process; configure()
    # must not strip what such a format reads (it did: every vLLM start-up line became a
    # "--- Logging error ---" traceback in the worker's log).
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        logging.Formatter("(%(processName)s pid=%(process)d) [%(filename)s:%(lineno)d] %(message)s")
    )
    library = logging.getLogger("some.library")
    library.addHandler(handler)
    library.propagate = False
    try:
        library.warning("resolved %s", "LlamaForCausalLM")
    finally:
        library.removeHandler(handler)
    assert f"pid={os.getpid()})" in out.getvalue()
    assert out.getvalue().endswith("resolved LlamaForCausalLM\n")
