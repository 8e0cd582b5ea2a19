"""Request bodies and their Content-Encoding on the whole path: a body compressed as it says is
served; one that is not is a 400 in OpenAI's format, and an encoding the edge does not decode a
415 — on every endpoint that reads a body, and never with a traceback in the edge's log, also
for a client refused before its body was read."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import zlib
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import MODEL, Stack

BODIES: dict[str, dict[str, Any]] = {
    "chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
    },
    "completions": {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3},
    "embeddings": {"model": MODEL, "input": "hello"},
}


async def post(
    stack: Stack, path: str, data: bytes, encoding: str, key: str | None = None
) -> tuple[int, Mapping[str, str], Any]:
    headers = {
        "Authorization": f"Bearer {key or stack.key}",
        "Content-Type": "application/json",
        "Content-Encoding": encoding,
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{stack.base_url}/{path}", data=data, headers=headers) as resp,
    ):
        return resp.status, resp.headers, await resp.json()


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.exc_info]


@pytest.mark.parametrize("path", list(BODIES))
async def test_a_body_compressed_as_it_says_is_served(stack: Stack, path: str) -> None:
    raw = json.dumps(BODIES[path]).encode()
    for encoding, packed in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw))):
        status, _, answer = await post(stack, path, packed, encoding)
        assert status == 200, answer


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("path", list(BODIES))
async def test_a_body_that_is_not_in_its_content_encoding_is_400_without_a_traceback(
    stack: Stack, path: str, encoding: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    raw = json.dumps(BODIES[path]).encode()
    status, _, answer = await post(stack, path, raw, encoding)
    assert status == 400
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_content_encoding"
    assert f"could not be decoded with Content-Encoding '{encoding}'" in error["message"]
    # Refused before the body is read: aiohttp drains it after the 401, and must not fail.
    status, _, answer = await post(stack, path, raw, encoding, key="sk-not-a-key")
    assert status == 401
    await asyncio.sleep(0.1)  # the drain runs after the answer is written
    assert tracebacks(caplog) == []


@pytest.mark.parametrize("path", list(BODIES))
async def test_an_unsupported_content_encoding_is_415_naming_the_supported_ones(
    stack: Stack, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    status, headers, answer = await post(stack, path, b"\x8b\x00\x80", "br")
    assert status == 415
    assert answer["error"]["message"] == (
        "unsupported Content-Encoding 'br'; supported: gzip, deflate, identity"
    )
    assert answer["error"]["code"] == "unsupported_content_encoding"
    assert headers["Accept-Encoding"] == "gzip, deflate, identity"
    assert "x-request-id" in headers  # the pipeline's headers are kept on the error
    assert tracebacks(caplog) == []


async def test_a_body_that_inflates_past_the_limit_is_413(stack: Stack) -> None:
    limit = stack.edge.server.config.request_limits.max_body_bytes
    padded = {**BODIES["chat/completions"], "user": "x" * limit}
    status, _, answer = await post(
        stack, "chat/completions", gzip.compress(json.dumps(padded).encode()), "gzip"
    )
    assert status == 413
    assert "once decoded" in answer["error"]["message"]
    assert stack.edge.counters.bodies_too_large == 1
