"""``make run ENGINE=vllm``, as a user runs it: ``python -m services.localstack --engine vllm``
(what the make target executes) with real processes, the official OpenAI SDK, then SIGTERM.

Started once for the module in a private state folder with ``EDGE_PORT=0``, so it never
collides with a stack the developer is running. The last test stops it and checks that no
process (the vLLM engine core included) and no listening port is left behind.
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from collections.abc import Iterator

import openai
import pytest

from services.localstack.config import DEFAULT_VLLM_MODEL, load_stack_config
from services.localstack.main import DEFAULT_CONFIG
from tests.support.stackproc import StackProcess, alive, start_stack_process
from tests.vllm.procs import descendants

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

EMBED_MODEL = "tiny-embed"  # deploy/local/stack.yaml, vllm.embedding


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackProcess]:
    state = tmp_path_factory.mktemp("meridian-state")
    # Builds the tiny model, imports vLLM and loads the engine before stack.json appears.
    try:
        running = start_stack_process(
            [sys.executable, "-m", "services.localstack", "--engine", "vllm"],
            state,
            timeout_s=300,
        )
    except RuntimeError as err:
        pytest.fail(str(err))
    yield running
    running.stop(timeout_s=120)


def test_the_stack_serves_the_tiny_model_from_one_vllm_worker(stack: StackProcess) -> None:
    assert stack.info["model"] == DEFAULT_VLLM_MODEL
    assert list(stack.info["workers"]) == ["kr-vllm-1", "kr-vllm-embed-1"]
    with stack.client() as client:
        models = {m.id: m for m in client.models.list()}
    assert set(models) == {DEFAULT_VLLM_MODEL, EMBED_MODEL}
    chat_caps = (models[DEFAULT_VLLM_MODEL].model_extra or {})["capabilities"]
    embed_caps = (models[EMBED_MODEL].model_extra or {})["capabilities"]
    assert (chat_caps["chat"], chat_caps["completions"], chat_caps["embeddings"]) == (
        True,
        True,
        False,
    )
    assert (embed_caps["embeddings"], embed_caps["chat"]) == (True, False)
    assert embed_caps["dimensions_configurable"] is True
    assert (stack.state / "tiny-model" / "config.json").is_file()
    worker_log = (stack.state / "run" / "logs" / "kr-vllm-1.log").read_text()
    assert '"engine":"vllm"' in worker_log


def test_chat_and_streamed_chat_come_from_the_vllm_worker(stack: StackProcess) -> None:
    with stack.client() as client:
        raw = client.chat.completions.with_raw_response.create(
            model=DEFAULT_VLLM_MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        done = raw.parse()
        assert raw.headers["x-meridian-worker"] == "kr-vllm-1"
        assert done.choices[0].finish_reason == "length"
        assert done.usage is not None
        assert done.usage.completion_tokens == 8
        chunks = list(
            client.chat.completions.create(
                model=DEFAULT_VLLM_MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8


def test_completions_and_embeddings_come_from_their_vllm_workers(stack: StackProcess) -> None:
    with stack.client() as client:
        done = client.completions.create(
            model=DEFAULT_VLLM_MODEL, prompt=[5, 17, 42], max_tokens=4, echo=True, logprobs=1
        )
        streamed = list(
            client.completions.create(
                model=DEFAULT_VLLM_MODEL, prompt="the edge", max_tokens=3, stream=True
            )
        )
        raw = client.embeddings.with_raw_response.create(
            model=EMBED_MODEL, input=["hello", "hello"], encoding_format="float"
        )
        short = client.embeddings.create(model=EMBED_MODEL, input="hello", dimensions=16)
        with pytest.raises(openai.BadRequestError) as wrong:
            client.embeddings.create(model=DEFAULT_VLLM_MODEL, input="hello")
    assert done.usage is not None
    assert done.usage.prompt_tokens == 3
    assert done.choices[0].logprobs is not None
    assert len(done.choices[0].logprobs.tokens or []) == 3 + 4
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "length"
    assert raw.headers["x-meridian-worker"] == "kr-vllm-embed-1"
    embedded = raw.parse()
    assert len(embedded.data[0].embedding) == 128
    assert embedded.data[0].embedding == embedded.data[1].embedding
    assert len(short.data[0].embedding) == 16
    assert isinstance(wrong.value.body, dict)
    assert wrong.value.body["param"] == "input"  # the chat model does not embed


def stack_vllm_options() -> dict[str, object]:
    """The vLLM options `make run ENGINE=vllm` starts its workers with."""
    return load_stack_config(DEFAULT_CONFIG).vllm_options


def test_a_request_the_model_cannot_fit_is_a_400_naming_max_tokens(stack: StackProcess) -> None:
    with stack.client() as client, pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=DEFAULT_VLLM_MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=5000,
        )
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["param"] == "max_tokens"
    context = stack_vllm_options()["max_model_len"]
    assert f"{context}-token context" in raised.value.body["message"]


def test_sigterm_leaves_no_process_no_engine_core_and_no_port(stack: StackProcess) -> None:
    pids = list(stack.info["pids"].values())
    engine = descendants(stack.info["pids"]["kr-vllm-1"])
    engine |= descendants(stack.info["pids"]["kr-vllm-embed-1"])
    assert engine, "the vLLM worker runs its engine core in child processes"
    ports = stack.ports()

    stack.proc.send_signal(signal.SIGTERM)
    assert stack.proc.wait(timeout=120) == 0

    deadline = time.monotonic() + 30
    left = [*pids, *engine]
    while left and time.monotonic() < deadline:
        left = [p for p in left if alive(p)]
        time.sleep(0.05)
    assert left == [], f"processes left behind: {left}"
    assert [p for p in ports if _listening(p)] == []
    assert "stopped." in stack.log.read_text()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
