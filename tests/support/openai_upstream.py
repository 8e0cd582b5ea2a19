"""A real OpenAI-compatible HTTP server on 127.0.0.1 for the ``--engine openai`` tests.

An aiohttp app in the test's own loop: ``GET /v1/models``, a streaming
``POST /v1/chat/completions`` (one content chunk per token every ``interval_s``, the finish
chunk, the usage chunk, ``[DONE]``) and, if given, a ``/metrics`` page. It records every
request it receives, and sets ``disconnected`` when a client goes away mid-stream — what the
cancellation tests check the upstream really saw.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from services.common.net import free_port


@dataclass
class Received:
    body: dict[str, Any]
    headers: dict[str, str]  # names lower-cased


@dataclass
class FakeUpstream:
    models: list[dict[str, object]] = field(
        default_factory=lambda: [{"id": "up-model", "object": "model", "max_model_len": 2048}]
    )
    tokens: int = 8
    interval_s: float = 0.0
    prompt_tokens: int = 11
    api_key: str | None = None
    #: (status, JSON body) answered to every chat request instead of a stream
    fail_with: tuple[int, dict[str, Any]] | None = None
    send_usage: bool = True
    #: send this many tokens, then close the connection without finishing
    cut_after: int | None = None
    logprobs: bool = False
    metrics_text: str | None = None
    #: a context length, in words of message content (a word is a token here): a chat request
    #: over it is refused as vLLM does (400, context_length_exceeded); ``POST /tokenize``
    #: counts; None: no limit, and no /tokenize (404)
    context_words: int | None = None
    tokenize: bool = True  # answer POST /tokenize (when context_words is set)
    tokenized: int = 0  # /tokenize calls answered
    received: list[Received] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    streaming: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> FakeUpstream:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeUpstream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _authorized(self, request: web.Request) -> bool:
        return self.api_key is None or request.headers.get("Authorization") == (
            f"Bearer {self.api_key}"
        )

    async def _models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        return web.json_response({"object": "list", "data": self.models})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_text is None:
            return web.Response(text="# nothing of vLLM's here\nprocess_cpu_seconds_total 1.0\n")
        return web.Response(text=self.metrics_text)

    @staticmethod
    def words(messages: list[dict[str, Any]]) -> int:
        return sum(len(str(m.get("content") or "").split()) for m in messages)

    async def _tokenize(self, request: web.Request) -> web.Response:
        if self.context_words is None or not self.tokenize:
            raise web.HTTPNotFound()
        body = await request.json()
        self.tokenized += 1
        count = self.words(body["messages"])
        return web.json_response({"count": count, "max_model_len": self.context_words})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(Received(body, {k.lower(): v for k, v in request.headers.items()}))
        if not self._authorized(request):
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        words = self.words(body["messages"])
        if self.context_words is not None and words + (body.get("max_tokens") or 1) > (
            self.context_words
        ):
            message = (
                f"This model's maximum context length is {self.context_words} tokens. "
                f"However, your request has {words} input tokens."
            )
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return web.json_response({"error": error}, status=400)
        if self.fail_with is not None:
            status, payload = self.fail_with
            return web.json_response(payload, status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        limit = body.get("max_tokens") or self.tokens
        n = min(self.tokens, limit)
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": body["model"]}

        async def send(obj: dict[str, Any] | str) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            await resp.write(f"data: {data}\n\n".encode())

        try:
            await send({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            self.streaming.set()
            for i in range(n):
                if self.cut_after is not None and i == self.cut_after:
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                if self.interval_s:
                    await asyncio.sleep(self.interval_s)
                choice: dict[str, Any] = {"index": 0, "delta": {"content": f"t{i} "}}
                if self.logprobs:
                    choice["logprobs"] = {
                        "content": [
                            {
                                "token": f"t{i} ",
                                "logprob": -0.5,
                                "top_logprobs": [{"token": f"t{i} ", "logprob": -0.5}],
                            }
                        ]
                    }
                await send({**base, "choices": [choice]})
            finish = "length" if n == limit and body.get("max_tokens") else "stop"
            await send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
            if self.send_usage and body.get("stream_options", {}).get("include_usage"):
                usage = {
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": n,
                    "total_tokens": self.prompt_tokens + n,
                }
                await send({**base, "choices": [], "usage": usage})
            await send("[DONE]")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnected.set()
            raise
        return resp
