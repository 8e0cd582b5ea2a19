"""POST /v1/responses as the shared stages see it: the Responses request is translated into
the chat request it means (services/edge/openai_responses.py) and is chat from there on —
the same bounds, reservation, route request and worker capabilities; only the terminal
stage renders the answer differently (services/edge/stages/stream_response.py)."""

from __future__ import annotations

from meridian.v1 import router_pb2
from services.common.errors import InvalidRequest
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.dialects.base import validate_object
from services.edge.dialects.chat import CHAT
from services.edge.jsonbody import load_object
from services.edge.openai_responses import (
    ResponsesRequest,
    chat_body,
    check_unsupported,
    in_responses_terms,
)
from services.edge.openai_types import validate_chat_request
from services.edge.request_limits import RequestLimits


class ResponsesDialect:
    endpoint = "responses"
    id_prefix = "resp_"

    def accept(
        self, raw: bytes, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> str:
        try:
            data = load_object(raw)
            check_unsupported(data)
            req = validate_object(data, ResponsesRequest)
            try:
                body = validate_chat_request(chat_body(req))
            except InvalidRequest as err:
                raise in_responses_terms(err) from None
        except InvalidRequest:
            counters.invalid_requests += 1
            raise
        ctx.responses = req
        try:
            return CHAT.accept_body(body, len(raw), ctx, limits, counters)
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


RESPONSES = ResponsesDialect()
