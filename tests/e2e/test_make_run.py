"""`make run`, as a user runs it: real processes, the official OpenAI SDK, then SIGTERM.

The stack is started once for this module (``EDGE_PORT=0`` and a private state folder, so it
never collides with a stack the developer is running), with two edge processes on the one
port (``EDGE_WORKERS=2``); the last test stops it and checks that no process (the edge's
children included) and no listening port is left behind.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.stackproc import StackProcess, alive, listening, start_stack_process

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackProcess]:
    try:
        running = start_stack_process(
            ["make", "-s", "run"],
            tmp_path_factory.mktemp("state"),
            extra_env={"EDGE_WORKERS": "2"},
        )
    except RuntimeError as err:
        pytest.fail(str(err))
    yield running
    running.stop()


def test_banner_prints_url_and_key(stack: StackProcess) -> None:
    out = stack.log.read_text()
    assert stack.info["edge_url"] in out
    assert stack.key in out
    assert oct((stack.state / "demo-key").stat().st_mode & 0o777) == "0o600"


def test_sync_client_chat_and_stream(stack: StackProcess) -> None:
    with stack.client() as client:
        models = [m.id for m in client.models.list()]
        assert models == [stack.info["model"]]
        done = client.chat.completions.create(
            model=models[0], messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        assert done.choices[0].message.content
        assert done.usage is not None
        assert done.usage.completion_tokens == 8
        pieces = [
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model=models[0],
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                max_tokens=8,
            )
            if c.choices
        ]
    assert "".join(pieces)


async def test_async_client_chat_and_stream(stack: StackProcess) -> None:
    async with openai.AsyncOpenAI(
        base_url=stack.base_url, api_key=stack.key, max_retries=0
    ) as client:
        done = await client.chat.completions.create(
            model=stack.info["model"],
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
        )
        assert done.choices[0].finish_reason == "length"
        stream = await client.chat.completions.create(
            model=stack.info["model"],
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            max_tokens=4,
        )
        finishes = [c.choices[0].finish_reason async for c in stream if c.choices]
    assert finishes[-1] == "length"


def test_wrong_key_and_malformed_request(stack: StackProcess) -> None:
    with (
        openai.OpenAI(base_url=stack.base_url, api_key="mk-" + "A" * 43, max_retries=0) as bad,
        pytest.raises(openai.AuthenticationError),
    ):
        bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    with stack.client() as client, pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=stack.info["model"], messages=[{"role": "user", "content": "x"}], top_p=3
        )
    assert "top_p" in str(exc.value)


def test_killing_a_worker_process_does_not_fail_new_requests(stack: StackProcess) -> None:
    with stack.client() as client:
        os.kill(stack.info["pids"]["kr-1"], signal.SIGKILL)
        for _ in range(10):
            done = client.chat.completions.create(
                model=stack.info["model"],
                messages=[{"role": "user", "content": "still?"}],
                max_tokens=2,
            )
            assert done.choices[0].message.content is not None


def test_the_edge_runs_as_two_processes_each_with_its_metrics(stack: StackProcess) -> None:
    edge_pids = [p for name, p in stack.info["pids"].items() if name.startswith("edge.")]
    assert len(edge_pids) == 2
    assert all(alive(p) for p in edge_pids)
    assert {"edge", "edge-1"} <= set(stack.info["metrics"])


def test_sigterm_leaves_no_process_and_no_port(stack: StackProcess) -> None:
    pids = list(stack.info["pids"].values())
    ports = stack.ports()
    stack.proc.send_signal(signal.SIGTERM)
    assert stack.proc.wait(timeout=60) is not None
    deadline = time.monotonic() + 10
    left = pids
    while left and time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        time.sleep(0.05)
    assert left == [], f"processes left behind: {left}"
    open_ports = [p for p in ports if listening(p)]
    assert open_ports == [], f"ports still listening: {open_ports}"
    assert "stopped." in stack.log.read_text()
