"""What the pipeline's stages hand each other for one request (every endpoint: chat,
completions, embeddings; each sets its own body)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from services.edge.openai_completions import CompletionRequest, EmbeddingRequest
from services.edge.openai_responses import ResponsesTurn
from services.edge.openai_types import ChatCompletionRequest
from services.edge.upstream.router_client import RouteResult

if TYPE_CHECKING:
    from meridian.v1 import worker_pb2
    from services.edge.guard import InFlight
    from services.edge.ratelimit.limiter import Lease
    from services.edge.tenancy.auth import Principal


#: Ask the router again for this request, leaving out the workers named (already tried).
Reroute = Callable[[Sequence[str]], Awaitable[RouteResult]]


@dataclass(slots=True)
class ChatContext:
    request: web.Request
    request_id: str
    started: float = field(default_factory=time.monotonic)
    # set by connection_guard: the request as the drain sees it (its deadline cuts it there)
    in_flight: InFlight | None = None
    principal: Principal | None = None  # set by authenticate
    model: str = ""  # set by validate: the model asked for, whatever the endpoint
    body: ChatCompletionRequest | None = None  # set by validate (chat)
    completion: CompletionRequest | None = None  # set by validate (completions)
    embedding: EmbeddingRequest | None = None  # set by validate (embeddings)
    # set by validate (responses): the request as the client sent it and the conversation it
    # goes on from; ``body`` is the chat request it was translated into
    responses: ResponsesTurn | None = None
    # Completions' prompts / embeddings' inputs, checked (text or token ids), set by validate.
    prompts: list[str | list[int]] = field(default_factory=list)
    prompt_tokens_estimate: int = 0  # set by validate
    session_id: str = ""  # set by validate (x-session-id)
    # set by validate for a large chat request: its messages, tools and response format as
    # a worker receives them, built once (upstream/protos.chat_payload)
    chat_payload: worker_pb2.GenerateRequest | None = None
    lease: Lease | None = None  # set by admit
    # set by admit: max_tokens for each choice of a request that set none, under a tpm limit
    completion_cap: int | None = None
    route: RouteResult | None = None  # set by route: the first ranking
    reroute: Reroute | None = None  # set by route: a new ranking, excluding some workers
    # Tokens really used so far (prompt + completion, from the worker's cumulative usage);
    # kept current by the stream stage, read by admit to settle the reservation.
    tokens_used: int = 0
    # Response headers every stage may add to (rate-limit headers, routing info); error
    # responses carry them too.
    headers: dict[str, str] = field(default_factory=dict)
