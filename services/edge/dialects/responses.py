"""POST /v1/responses as the shared stages see it: the Responses request is translated into
the chat request it means (services/edge/openai_responses.py) and is chat from there on —
the same bounds, reservation, route request and worker capabilities; only the terminal
stage renders the answer differently (services/edge/stages/stream_response.py).

A request that goes on from a stored response (``previous_response_id``) is translated in
:meth:`ResponsesDialect.resolve`, once that response is read from Redis: its conversation
comes before this input, and the prompt limits apply to the whole.
"""

from __future__ import annotations

import json

from meridian.v1 import router_pb2
from services.common.errors import InvalidRequest
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.dialects.base import validate_object
from services.edge.dialects.chat import CHAT
from services.edge.jsonbody import load_object
from services.edge.offload import OFF_LOOP_BYTES, off_loop
from services.edge.openai_responses import (
    RESPONSE_ID,
    ResponsesRequest,
    ResponsesTurn,
    chat_body,
    check_unsupported,
    in_responses_terms,
)
from services.edge.openai_types import validate_chat_request
from services.edge.request_limits import RequestLimits
from services.edge.responses_store import ResponseStore


class ResponsesDialect:
    endpoint = "responses"
    id_prefix = "resp_"

    def __init__(self, store: ResponseStore | None = None) -> None:
        self._store = store

    def accept(
        self, raw: bytes, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> str:
        try:
            data = load_object(raw)
            check_unsupported(data)
            try:
                req = validate_object(data, ResponsesRequest)
            except InvalidRequest as err:
                raise in_responses_terms(err) from None
        except InvalidRequest:
            counters.invalid_requests += 1
            raise
        turn = ResponsesTurn(req, raw_bytes=len(raw))
        ctx.responses = turn
        if req.previous_response_id is not None:
            turn.pending = True  # translated once the previous response is read (resolve)
            return req.model
        self._translate(turn, len(raw), ctx, limits, counters)
        return req.model

    async def resolve(
        self, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> None:
        turn = ctx.responses
        if turn is None or not turn.pending:
            return
        previous_id = turn.req.previous_response_id
        assert previous_id is not None and ctx.principal is not None
        stored = None
        if self._store is not None and RESPONSE_ID.fullmatch(previous_id):
            stored = await self._store.get(ctx.principal.tenant.tenant_id, previous_id)
        if stored is None:
            counters.invalid_requests += 1
            raise InvalidRequest(
                f"Previous response with id '{previous_id}' not found"
                + ("." if self._store is not None else ": responses are not stored here."),
                param="previous_response_id",
                code="previous_response_not_found",
            )
        turn.previous = stored.context
        turn.previous_bytes = stored.size
        turn.pending = False
        if turn.raw_bytes + stored.size <= OFF_LOOP_BYTES:
            self._translate_whole(turn, ctx, limits, counters)
            return
        # A long conversation is checked off the loop, as a large body is (stages/validate.py).
        counted = EdgeCounters()
        try:
            await off_loop(self._translate_whole, turn, ctx, limits, counted)
        finally:
            counters.add(counted)

    def _translate_whole(
        self, turn: ResponsesTurn, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> None:
        """The stored context counts toward the request's size (its encoded size is checked)."""
        size = turn.raw_bytes + len(json.dumps(turn.previous))
        self._translate(turn, size, ctx, limits, counters)

    def _translate(
        self,
        turn: ResponsesTurn,
        raw_bytes: int,
        ctx: ChatContext,
        limits: RequestLimits,
        counters: EdgeCounters,
    ) -> None:
        try:
            try:
                body = validate_chat_request(chat_body(turn.req, turn))
            except InvalidRequest as err:
                raise in_responses_terms(err) from None
        except InvalidRequest:
            counters.invalid_requests += 1
            raise
        try:
            CHAT.accept_body(body, raw_bytes, ctx, limits, counters)
        except InvalidRequest as err:
            raise in_responses_terms(err) from None

    def completion_budget(self, ctx: ChatContext) -> int | None:
        return CHAT.completion_budget(ctx)

    def choices(self, ctx: ChatContext) -> int:
        return CHAT.choices(ctx)

    def route_request(
        self, ctx: ChatContext, *, site: str, exclude: tuple[str, ...] = ()
    ) -> router_pb2.RouteRequest:
        return CHAT.route_request(ctx, site=site, exclude=exclude)


#: Without a store: what the app's id prefix is read from; the app builds its own with one.
RESPONSES = ResponsesDialect()
