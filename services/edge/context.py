"""What the chat pipeline's stages hand each other for one request."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from meridian.v1 import router_pb2
from services.edge.openai_types import ChatCompletionRequest
from services.edge.upstream import RouteResult

if TYPE_CHECKING:
    from services.edge.auth import Principal
    from services.edge.ratelimit.limiter import Lease


@dataclass(slots=True)
class ChatContext:
    request: web.Request
    request_id: str
    started: float = field(default_factory=time.monotonic)
    principal: Principal | None = None  # set by authenticate
    body: ChatCompletionRequest | None = None  # set by validate
    prompt_tokens_estimate: int = 0  # set by validate
    session_id: str = ""  # set by validate (x-session-id)
    lease: Lease | None = None  # set by admit
    route_request: router_pb2.RouteRequest | None = None  # set by route
    route: RouteResult | None = None  # set by route
    # Tokens really used so far (prompt + completion, from the worker's cumulative usage);
    # kept current by the stream stage, read by admit to settle the reservation.
    tokens_used: int = 0
    # Response headers every stage may add to (rate-limit headers, routing info); error
    # responses carry them too.
    headers: dict[str, str] = field(default_factory=dict)
