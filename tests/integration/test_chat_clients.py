"""Acceptance: the clients agents and tools are built on, against the edge (simulated workers).

- LangChain's ``ChatOpenAI``: ``with_structured_output(Model)`` (its default method sends
  ``response_format: json_schema`` with ``strict``) returns a validated model, and
  ``bind_tools`` returns ``AIMessage.tool_calls`` (streamed and not);
- simonw's ``llm`` CLI, as a separate process, with an ``extra-openai-models.yaml`` entry that
  declares ``supports_tools`` and ``supports_schema``: ``--schema`` answers JSON that
  validates, ``--functions`` runs a tool the model (SimEngine's rule: the prompt names it)
  called, and the chain ends with a text answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.integration.conftest import MODEL, Stack


class Forecast(BaseModel):
    """A weather forecast for one city."""

    city: str = Field(description="the city")
    days: int = Field(ge=1, le=7)
    sunny: bool


class get_weather(BaseModel):
    """Look up the weather for a city."""

    city: str


async def chat_model(stack: Stack, http: httpx.AsyncClient, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL,
        base_url=stack.base_url,
        api_key=stack.key,  # type: ignore[arg-type]
        max_retries=0,
        http_async_client=http,
        **kw,
    )


async def test_langchain_structured_output_default_method_returns_the_model(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        chat = await chat_model(stack, http)
        structured = chat.with_structured_output(Forecast)  # method="json_schema" by default
        result = await structured.ainvoke("Forecast for Seoul")
    assert isinstance(result, Forecast)
    assert 1 <= result.days <= 7


async def test_langchain_bind_tools_returns_tool_calls(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        chat = await chat_model(stack, http)
        with_tools = chat.bind_tools([get_weather])
        message = await with_tools.ainvoke("Please call get_weather for Busan")
        chunks = [c async for c in with_tools.astream("get_weather for Jeju, please")]
    assert isinstance(message, AIMessage)
    assert [c["name"] for c in message.tool_calls] == ["get_weather"]
    assert isinstance(message.tool_calls[0]["args"]["city"], str)
    assert message.tool_calls[0]["id"]
    streamed: Any = chunks[0]
    for c in chunks[1:]:
        streamed = streamed + c  # LangChain joins tool-call chunks by index
    assert [c["name"] for c in streamed.tool_calls] == ["get_weather"]


async def test_langchain_tool_choice_forces_a_named_tool(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        chat = await chat_model(stack, http)
        forced = chat.bind_tools([get_weather], tool_choice="get_weather")
        message = await forced.ainvoke("no tool mentioned here")
    assert isinstance(message, AIMessage)
    assert [c["name"] for c in message.tool_calls] == ["get_weather"]


# -- simonw's llm ---------------------------------------------------------------------------------


@pytest.fixture
def llm_home(stack: Stack, tmp_path: Path) -> Path:
    home = tmp_path / "llm"
    home.mkdir()
    (home / "extra-openai-models.yaml").write_text(
        f"""- model_id: meridian
  model_name: {MODEL}
  api_base: {stack.base_url}
  api_key_name: meridian
  supports_tools: true
  supports_schema: true
"""
    )
    (home / "keys.json").write_text(json.dumps({"meridian": stack.key}))
    return home


async def run_llm(home: Path, *args: str) -> tuple[int, str, str]:
    """``llm`` as its own process (the stack runs in this event loop: never block it)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llm",
        *args,
        env={
            **os.environ,
            "LLM_USER_PATH": str(home),
            "NO_COLOR": "1",
            "LLM_OPENAI_SHOW_RESPONSES": "1",
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(), err.decode()


async def test_llm_cli_schema_answers_json_that_validates(llm_home: Path) -> None:
    code, out, err = await run_llm(
        llm_home, "-m", "meridian", "--schema", "name, age int, pet bool", "Invent a person"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert isinstance(doc["name"], str)
    assert isinstance(doc["age"], int)
    assert isinstance(doc["pet"], bool)


async def test_llm_cli_runs_the_tool_the_model_called(llm_home: Path) -> None:
    functions = "def get_weather(city: str) -> str:\n    return 'TOOL-RAN:' + city\n"
    code, out, err = await run_llm(
        llm_home,
        "-m",
        "meridian",
        "--functions",
        functions,
        "--td",
        "Use get_weather for Seoul",
    )
    assert code == 0, err
    shown = out + err  # --td and LLM_OPENAI_SHOW_RESPONSES write to stderr
    assert "get_weather" in shown  # the call, as --td shows it
    assert '"role": "tool"' in err  # the second request carries the tool's result ...
    assert "TOOL-RAN:" in err
    assert out.strip()  # ... and the model (SimEngine: a tool result last) answers in text
