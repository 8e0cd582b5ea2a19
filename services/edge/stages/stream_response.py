"""The ``stream`` stage of POST /v1/responses, terminal: chat's stream stage
(:class:`~services.edge.stages.stream.Stream`: failover, mid-stream migration, keep-alives
before a slow first token, bounded writes, merging while the client is behind, client
disconnect, the drain deadline's cut — all inherited) with the answer rendered as a
``response`` object or as its typed events (services/edge/render_response.py).

A finished response is stored (unless the request said ``store: false``) before its last
event or its body is sent, so a client that has it can go on from it at once; one that
failed, was cut or whose client left is not.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from meridian.v1 import worker_pb2
from services.common.errors import MeridianError
from services.edge.context import ChatContext
from services.edge.guard import cut_scope
from services.edge.httperrors import Interrupted
from services.edge.offload import json_answer
from services.edge.openai_responses import ResponsesTurn
from services.edge.openai_types import ChatCompletionRequest, now_s
from services.edge.render import FINISH_REASONS, ChoiceAssembler
from services.edge.render_response import (
    ResponseEvents,
    assistant_message,
    output_items,
    response_object,
    status_of,
)
from services.edge.responses_store import ResponseStore, StoredResponse
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


class ResponsesStream(Stream):
    """The terminal stage of POST /v1/responses (see the module docstring)."""

    done_event = "response.completed"
    operation = "chat"

    def __init__(self, *, store: ResponseStore | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._store = store

    def _wants_store(self, turn: ResponsesTurn) -> bool:
        return self._store is not None and turn.req.store is not False

    async def _keep(self, ctx: ChatContext, turn: ResponsesTurn, response: dict[str, Any]) -> None:
        """Store ``response`` with the conversation so far; ``response["store"]`` says
        whether it was."""
        assert self._store is not None and ctx.principal is not None
        stored = StoredResponse(
            response=response,
            context=[*turn.previous, *turn.input_messages, assistant_message(response["output"])],
            input_items=turn.input_items(ctx.request_id),
        )
        response["store"] = True  # as the stored copy must say (a GET returns it)
        response["store"] = await self._store.put(
            ctx.principal.tenant.tenant_id, stored, size_hint=turn.raw_bytes + turn.previous_bytes
        )
        if response["store"]:
            self._counters.responses_stored += 1
        else:
            self._counters.responses_not_stored += 1

    async def _complete(
        self,
        ctx: ChatContext,
        body: ChatCompletionRequest,
        opening: asyncio.Future[UpstreamStream],
        migrating: _Migrating,
    ) -> web.StreamResponse:
        turn = ctx.responses
        assert turn is not None, "after validate"
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
        choice = choices.choices()[0]
        response = response_object(
            response_id=ctx.request_id,
            req=turn.req,
            created=now_s(),
            status=status_of(choice["finish_reason"]),
            output=output_items(ctx.request_id, choice, logprobs),
            usage=last.usage,
            extension=_extension(stream),
        )
        if self._wants_store(turn):
            await self._keep(ctx, turn, response)
        return await json_answer(
            lambda: response,
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
        turn = ctx.responses
        assert turn is not None, "after validate"
        render = ResponseEvents(
            response_id=ctx.request_id,
            req=turn.req,
            created=now_s(),
            logprobs=bool(body.logprobs),
            store=self._wants_store(turn),
        )
        # A failure after the headers, before the first token (keep-alives went out): the
        # Responses events for it (response.created, error, response.failed), not chat's.
        opened = await self._open_sse(
            ctx, opening, lambda up: _route_headers(up, None), lambda err: render.failed(err, None)
        )
        if isinstance(opened, web.StreamResponse):
            return opened  # it ended before its first token
        resp, upstream = opened
        stream = migrating(upstream)
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
                response = render.final(finish, last.usage, _extension(stream))
                if self._wants_store(turn):
                    await self._keep(ctx, turn, response)
                await self._write(ctx, resp, render.finish(response))
                self._counters.completions += 1
        except Interrupted as err:
            stream.cancel()  # the worker stops now, not after the last write
            await self._end_cut(ctx, resp, err, lambda e: render.failed(e, last.usage))
        except MeridianError as err:
            self._note_failed(ctx, err, stream.migrations)
            with contextlib.suppress(ClientGone):
                await self._write(ctx, resp, render.failed(err, last.usage))
        except ClientGone:
            pass
        finally:
            stream.cancel()
            self._log_done(ctx, stream, last, tool_calls=tool_calls)
            self._note_tool_calls(tool_calls)
        return resp
