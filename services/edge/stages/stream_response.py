"""The ``stream`` stage of POST /v1/responses, terminal: chat's stream stage
(:class:`~services.edge.stages.stream.Stream`: failover, mid-stream migration, keep-alives
before a slow first token, bounded writes, merging while the client is behind, client
disconnect, the drain deadline's cut — all inherited) with the answer rendered as a
``response`` object or as its typed events (services/edge/render_response.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web

from meridian.v1 import worker_pb2
from services.common.errors import MeridianError
from services.common.logs import event
from services.edge.context import ChatContext
from services.edge.guard import cut_scope
from services.edge.httperrors import Interrupted
from services.edge.offload import json_answer
from services.edge.openai_types import ChatCompletionRequest, now_s
from services.edge.render import FINISH_REASONS, ChoiceAssembler
from services.edge.render_response import ResponseEvents, output_items, response_object, status_of
from services.edge.stages.stream import (
    ClientGone,
    Stream,
    _answer_items,
    _extension,
    _Migrating,
    _route_headers,
    _track_usage,
)
from services.edge.upstream.failover import UpstreamStream

log = logging.getLogger("meridian.edge")


class ResponsesStream(Stream):
    """The terminal stage of POST /v1/responses (see the module docstring)."""

    done_event = "response.completed"
    operation = "chat"

    async def _complete(
        self,
        ctx: ChatContext,
        body: ChatCompletionRequest,
        opening: asyncio.Future[UpstreamStream],
        migrating: _Migrating,
    ) -> web.StreamResponse:
        req = ctx.responses
        assert req is not None, "after validate"
        stream = migrating(await opening)
        choices = ChoiceAssembler(choices=1, logprobs=bool(body.logprobs))
        logprobs: list[worker_pb2.TokenLogprob] | None = [] if body.logprobs else None
        last = stream.current.first
        try:
            async with contextlib.aclosing(stream.chunks()) as chunks:
                async for chunk in chunks:
                    _track_usage(ctx, chunk)
                    choices.add(chunk)
                    if logprobs is not None:
                        logprobs.extend(chunk.logprobs)
                    last = chunk
        finally:
            stream.cancel()
        self._log_done(ctx, stream, last, tool_calls=choices.tool_calls())
        self._note_tool_calls(choices.tool_calls())
        self._counters.completions += 1
        created, extension = now_s(), _extension(stream)
        choice = choices.choices()[0]
        return await json_answer(
            lambda: response_object(
                response_id=ctx.request_id,
                req=req,
                created=created,
                status=status_of(choice["finish_reason"]),
                output=output_items(ctx.request_id, choice, logprobs),
                usage=last.usage,
                extension=extension,
            ),
            items=_answer_items(body, last),
            headers={**ctx.headers, **_route_headers(stream.current, stream)},
        )

    async def _stream(
        self,
        ctx: ChatContext,
        body: ChatCompletionRequest,
        opening: asyncio.Future[UpstreamStream],
        migrating: _Migrating,
    ) -> web.StreamResponse:
        req = ctx.responses
        assert req is not None, "after validate"
        opened = await self._open_sse(ctx, opening, lambda up: _route_headers(up, None))
        if isinstance(opened, web.StreamResponse):
            return opened  # it ended before its first token
        resp, upstream = opened
        stream = migrating(upstream)
        render = ResponseEvents(
            response_id=ctx.request_id, req=req, created=now_s(), logprobs=bool(body.logprobs)
        )
        last = upstream.first
        tool_calls = 0
        try:
            async with cut_scope(ctx.in_flight):
                await self._write(ctx, resp, render.start())
                async with contextlib.aclosing(self._merged(ctx, stream.chunks())) as chunks:
                    async for chunk in chunks:
                        last = chunk
                        _track_usage(ctx, chunk)
                        data = render.chunk(chunk)
                        if data:
                            await self._write(ctx, resp, data)
                        tool_calls += sum(1 for c in chunk.tool_calls if c.id)
                finish = FINISH_REASONS.get(last.finish_reason, "stop")
                await self._write(ctx, resp, render.finish(finish, last.usage, _extension(stream)))
                self._counters.completions += 1
        except Interrupted as err:
            stream.cancel()  # the worker stops now, not after the last write
            await self._end_cut(ctx, resp, err)
        except MeridianError as err:
            self._counters.stream_errors += 1
            event(
                log,
                "stream.failed",
                level=logging.WARNING,
                request_id=ctx.request_id,
                error=err.message,
                migrations=stream.migrations,
            )
            with contextlib.suppress(ClientGone):
                await self._write(ctx, resp, render.failed(err, last.usage))
        except ClientGone:
            pass
        finally:
            stream.cancel()
            self._log_done(ctx, stream, last, tool_calls=tool_calls)
            self._note_tool_calls(tool_calls)
        return resp
