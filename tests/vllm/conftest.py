"""One tiny model and one running vLLM engine for the whole session (engine start is ~20 s).

The engine fixture lives on the session's event loop, so every test that uses it runs on that
loop too: mark such tests ``@pytest.mark.asyncio(loop_scope="session")``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from services.worker.vllm.config import VllmConfig
from services.worker.vllm.engine import VllmEngine
from services.worker.vllm.tinymodel import build_tiny_model

SERVED_NAME = "tiny-llama"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def engine(tiny_model_dir: Path) -> AsyncIterator[VllmEngine]:
    eng = VllmEngine(VllmConfig.cpu_test(tiny_model_dir, served_model_name=SERVED_NAME))
    await eng.start()
    yield eng
    await eng.shutdown()
