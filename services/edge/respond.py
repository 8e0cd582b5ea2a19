"""The terminal stage: open the token stream (with failover) and answer the client, as SSE
chunks or as one ``chat.completion`` object.

Streaming: HTTP headers are committed when the first token arrives, so anything that fails
before that is a proper HTTP error. If the first token takes longer than
``keepalive_after_s``, headers are committed early and SSE comments keep the connection alive;
a failure after that point is sent as an SSE ``error`` payload, which the OpenAI SDK raises.

Client disconnect: aiohttp cancels this handler (``handler_cancellation=True``); the ``finally``
cancels the worker call, which aborts the generation in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aiohttp import web

from meridian.v1 import worker_pb2
from services.common.errors import MeridianError
from services.common.logs import event
from services.edge.context import ChatContext
from services.edge.failover import FailoverPolicy, UpstreamStream, open_stream
from services.edge.openai_types import ChatCompletionRequest, now_s
from services.edge.render import (
    FINISH_REASONS,
    SSE_DONE,
    SSE_KEEPALIVE,
    ChunkRenderer,
    completion_body,
    sse_data,
)
from services.edge.upstream import RouterClient, WorkerPool

log = logging.getLogger("meridian.edge")


def generate_request(ctx: ChatContext) -> worker_pb2.GenerateRequest:
    body = ctx.body
    assert body is not None and ctx.key is not None
    req = worker_pb2.GenerateRequest(
        request_id=ctx.request_id, model=body.model, tenant_id=ctx.key.tenant
    )
    for m in body.messages:
        req.messages.add(role=m.role, content=m.text(), name=m.name or "")
    s = req.sampling
    if body.temperature is not None:
        s.temperature = body.temperature
    if body.top_p is not None:
        s.top_p = body.top_p
    max_tokens = body.effective_max_tokens()
    if max_tokens is not None:
        s.max_tokens = max_tokens
    s.stop.extend(body.stop_list())
    if body.seed is not None:
        s.seed = body.seed
    if body.presence_penalty is not None:
        s.presence_penalty = body.presence_penalty
    if body.frequency_penalty is not None:
        s.frequency_penalty = body.frequency_penalty
    s.logprobs = bool(body.logprobs)
    s.top_logprobs = body.top_logprobs or 0
    s.ignore_eos = body.ignore_eos
    return req


class Respond:
    name = "stream"

    def __init__(
        self,
        *,
        router: RouterClient,
        workers: WorkerPool,
        policy: FailoverPolicy,
        keepalive_after_s: float = 3.0,
        keepalive_every_s: float = 10.0,
    ) -> None:
        self._router = router
        self._workers = workers
        self._policy = policy
        self._keepalive_after_s = keepalive_after_s
        self._keepalive_every_s = keepalive_every_s

    async def __call__(self, ctx: ChatContext) -> web.StreamResponse:
        assert ctx.body is not None and ctx.route is not None and ctx.route_request is not None
        opening = asyncio.ensure_future(
            open_stream(
                router=self._router,
                workers=self._workers,
                route_request=ctx.route_request,
                first_route=ctx.route,
                generate=generate_request(ctx),
                policy=self._policy,
            )
        )
        try:
            if ctx.body.stream:
                return await self._stream(ctx, ctx.body, opening)
            return await self._complete(ctx, ctx.body, opening)
        finally:
            if not opening.done():
                opening.cancel()
                with contextlib.suppress(asyncio.CancelledError, MeridianError):
                    await opening

    async def _complete(
        self,
        ctx: ChatContext,
        body: ChatCompletionRequest,
        opening: asyncio.Future[UpstreamStream],
    ) -> web.StreamResponse:
        upstream = await opening
        text: list[str] = []
        logprobs: list[worker_pb2.TokenLogprob] | None = [] if body.logprobs else None
        last = upstream.first
        try:
            async for chunk in upstream.chunks():
                text.append(chunk.text)
                if logprobs is not None:
                    logprobs.extend(chunk.logprobs)
                last = chunk
        finally:
            upstream.cancel()
        self._log_done(ctx, upstream, last)
        payload = completion_body(
            completion_id=ctx.request_id,
            model=body.model,
            created=now_s(),
            fingerprint=_fingerprint(upstream),
            text="".join(text),
            finish=FINISH_REASONS.get(last.finish_reason, "stop"),
            usage=last.usage,
            logprobs=logprobs,
        )
        return web.json_response(payload, headers={**ctx.headers, **_route_headers(upstream)})

    async def _stream(
        self,
        ctx: ChatContext,
        body: ChatCompletionRequest,
        opening: asyncio.Future[UpstreamStream],
    ) -> web.StreamResponse:
        done, _ = await asyncio.wait({opening}, timeout=self._keepalive_after_s)
        resp: web.StreamResponse | None = None
        if not done:
            # Slow first token: commit headers now and keep the connection alive.
            resp = await self._start_sse(ctx, {})
            while True:
                done, _ = await asyncio.wait({opening}, timeout=self._keepalive_every_s)
                if done:
                    break
                await resp.write(SSE_KEEPALIVE)
        try:
            upstream = opening.result()
        except MeridianError as err:
            if resp is None:
                raise
            await resp.write(sse_data(err.to_openai()))
            return resp
        if resp is None:
            resp = await self._start_sse(ctx, _route_headers(upstream))
        render = ChunkRenderer(
            completion_id=ctx.request_id,
            model=body.model,
            created=now_s(),
            fingerprint=_fingerprint(upstream),
            usage=body.include_usage(),
        )
        last = upstream.first
        try:
            await resp.write(render.role())
            async for chunk in upstream.chunks():
                last = chunk
                data = render.content(chunk)
                if data is not None:
                    await resp.write(data)
            await resp.write(render.finish(FINISH_REASONS.get(last.finish_reason, "stop")))
            if body.include_usage():
                await resp.write(render.usage(last.usage))
            await resp.write(SSE_DONE)
        except MeridianError as err:
            event(
                log,
                "stream.failed",
                level=logging.WARNING,
                request_id=ctx.request_id,
                error=err.message,
            )
            await resp.write(sse_data(err.to_openai()))
        finally:
            upstream.cancel()
            self._log_done(ctx, upstream, last)
        return resp

    async def _start_sse(self, ctx: ChatContext, extra: dict[str, str]) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **ctx.headers,
                **extra,
            },
        )
        await resp.prepare(ctx.request)
        return resp

    def _log_done(
        self, ctx: ChatContext, upstream: UpstreamStream, last: worker_pb2.GenerateChunk
    ) -> None:
        event(
            log,
            "chat.completed",
            request_id=ctx.request_id,
            tenant=ctx.key.tenant if ctx.key else "",
            key_id=ctx.key.key_id if ctx.key else "",
            worker_id=upstream.candidate.worker_id,
            region=upstream.candidate.region,
            attempts=upstream.attempts,
            ttft_ms=round(upstream.ttft_ms, 2),
            duration_ms=round((time.monotonic() - ctx.started) * 1000, 2),
            prompt_tokens=last.usage.prompt_tokens,
            completion_tokens=last.usage.completion_tokens,
            finish=FINISH_REASONS.get(last.finish_reason, "incomplete"),
        )


def _route_headers(upstream: UpstreamStream) -> dict[str, str]:
    return {
        "x-meridian-region": upstream.candidate.region,
        "x-meridian-worker": upstream.candidate.worker_id,
        "x-meridian-attempts": str(upstream.attempts),
    }


def _fingerprint(upstream: UpstreamStream) -> str:
    return f"meridian-{upstream.candidate.region}"
