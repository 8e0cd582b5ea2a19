"""What the chat pipeline's stages hand each other for one request."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aiohttp import web

from meridian.v1 import router_pb2
from services.edge.apikeys import KeyRecord
from services.edge.openai_types import ChatCompletionRequest
from services.edge.upstream import RouteResult


@dataclass(slots=True)
class ChatContext:
    request: web.Request
    request_id: str
    started: float = field(default_factory=time.monotonic)
    key: KeyRecord | None = None  # set by authenticate
    body: ChatCompletionRequest | None = None  # set by validate
    prompt_tokens_estimate: int = 0  # set by validate
    route_request: router_pb2.RouteRequest | None = None  # set by route
    route: RouteResult | None = None  # set by route
    # Response headers every stage may add to (rate-limit headers, routing info).
    headers: dict[str, str] = field(default_factory=dict)
