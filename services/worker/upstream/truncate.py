"""``truncate_oldest`` in front of an upstream server: its own tokenizer counts the candidates.

The worker cannot count an upstream model's prompt (its tokenizer and chat template are the
upstream's), so the conversation goes out whole first; only when the upstream refuses it for
its length are the oldest turns dropped (services/worker/truncation.py), each candidate
counted by the upstream's ``POST /tokenize`` (vLLM's and SGLang's: ``{"model", "messages",
"add_generation_prompt"}`` → ``{"count", "max_model_len"}``), a cheap call that runs no model.
An upstream without it keeps its refusal, which then says why nothing was dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import aiohttp

from services.common.errors import ContextLengthExceeded
from services.worker.engine import ChatTurn, EngineRequest
from services.worker.truncation import fit_oldest_async, max_prompt_tokens
from services.worker.upstream.wire import chat_messages

MAX_TOKENIZE_BODY_BYTES = 16 * 1024 * 1024  # the token ids come back too


class NoTokenizer(Exception):
    """The upstream did not count a conversation (no ``/tokenize``, or it failed)."""


async def fit_upstream(
    session: aiohttp.ClientSession,
    *,
    origin: str,
    upstream_model: str,
    request: EngineRequest,
    max_model_len: int,
    refusal: ContextLengthExceeded,
    timeout_s: float,
) -> tuple[EngineRequest, int]:
    """``request`` with the fewest oldest messages dropped for the upstream to take it, and
    how many; ``refusal`` (the upstream's own) again, explained, when it cannot count."""
    limit = max_model_len

    async def count(messages: tuple[ChatTurn, ...]) -> int:
        nonlocal limit
        body = {
            "model": upstream_model,
            "messages": chat_messages(messages),
            "add_generation_prompt": True,
        }
        try:
            async with asyncio.timeout(timeout_s):
                async with session.post(f"{origin}/tokenize", json=body) as resp:
                    if resp.status != 200:
                        raise NoTokenizer(f"HTTP {resp.status}")
                    raw = await resp.content.read(MAX_TOKENIZE_BODY_BYTES)
            answer: Any = json.loads(raw)
            tokens = int(answer["count"])
            limit = int(answer.get("max_model_len") or limit)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError, TypeError) as e:
            raise NoTokenizer(type(e).__name__) from None
        return tokens

    try:
        whole = await count(request.messages)
        fitted = await fit_oldest_async(
            request.messages,
            count,
            lambda tokens: tokens <= max_prompt_tokens(limit, request.sampling.max_tokens),
            measured=whole,
        )
    except NoTokenizer as err:
        raise ContextLengthExceeded(
            f"{refusal.message} (truncation 'auto' needs the upstream's POST /tokenize to "
            f"count the conversation, and it did not answer: {err})",
            param=refusal.param,
        ) from None
    return dataclasses.replace(request, messages=fitted.messages), fitted.dropped
