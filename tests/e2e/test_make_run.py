"""`make run`, as a user runs it: real processes, the official OpenAI SDK, then SIGTERM.

The stack is started once for this module (``EDGE_PORT=0`` and a private state folder, so it
never collides with a stack the developer is running); the last test stops it and checks that
no process and no listening port is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@dataclass
class MakeRun:
    proc: subprocess.Popen[bytes]
    state: Path
    info: dict[str, Any]
    key: str
    log: Path

    @property
    def base_url(self) -> str:
        return f"{self.info['edge_url']}/v1"

    def ports(self) -> list[int]:
        addrs = [self.info["edge_url"].rsplit(":", 1)[1], self.info["router"].rsplit(":", 1)[1]]
        for w in self.info["workers"].values():
            addrs += [w["direct"].rsplit(":", 1)[1], w["proxied"].rsplit(":", 1)[1]]
        addrs.append(self.info["redis_url"].rsplit(":", 1)[1].split("/")[0])
        return [int(a) for a in addrs]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeRun]:
    state = tmp_path_factory.mktemp("meridian-state")
    log = state / "make-run.log"
    env = {**os.environ, "EDGE_PORT": "0", "MERIDIAN_STATE_DIR": str(state)}
    env.pop("REDIS_URL", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["make", "-s", "run"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    info_file = state / "run" / "stack.json"
    deadline = time.monotonic() + 90
    while not info_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"make run did not come up:\n{log.read_text()[-4000:]}")
        time.sleep(0.1)
    info = json.loads(info_file.read_text())
    key = (state / "demo-key").read_text().strip()
    run = MakeRun(proc, state, info, key, log)
    yield run
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_banner_prints_url_and_key(stack: MakeRun) -> None:
    out = stack.log.read_text()
    assert stack.info["edge_url"] in out
    assert stack.key in out
    assert oct((stack.state / "demo-key").stat().st_mode & 0o777) == "0o600"


def test_sync_client_chat_and_stream(stack: MakeRun) -> None:
    client = openai.OpenAI(base_url=stack.base_url, api_key=stack.key, max_retries=0)
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


async def test_async_client_chat_and_stream(stack: MakeRun) -> None:
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.key, max_retries=0)
    done = await client.chat.completions.create(
        model=stack.info["model"], messages=[{"role": "user", "content": "hello"}], max_tokens=4
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


def test_wrong_key_and_malformed_request(stack: MakeRun) -> None:
    bad = openai.OpenAI(base_url=stack.base_url, api_key="mk-" + "A" * 43, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    client = openai.OpenAI(base_url=stack.base_url, api_key=stack.key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=stack.info["model"], messages=[{"role": "user", "content": "x"}], top_p=3
        )
    assert "top_p" in str(exc.value)


def test_killing_a_worker_process_does_not_fail_new_requests(stack: MakeRun) -> None:
    client = openai.OpenAI(base_url=stack.base_url, api_key=stack.key, max_retries=0)
    os.kill(stack.info["pids"]["kr-1"], signal.SIGKILL)
    for _ in range(10):
        done = client.chat.completions.create(
            model=stack.info["model"],
            messages=[{"role": "user", "content": "still?"}],
            max_tokens=2,
        )
        assert done.choices[0].message.content is not None


def test_sigterm_leaves_no_process_and_no_port(stack: MakeRun) -> None:
    pids = list(stack.info["pids"].values())
    ports = stack.ports()
    stack.proc.send_signal(signal.SIGTERM)
    assert stack.proc.wait(timeout=60) is not None
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        time.sleep(0.05)
    assert alive == [], f"processes left behind: {alive}"
    listening = [p for p in ports if _listening(p)]
    assert listening == [], f"ports still listening: {listening}"
    assert "stopped." in stack.log.read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
