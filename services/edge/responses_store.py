"""Stored responses (the Responses API's ``store``), in the edge's Redis.

A stored response is what a later request needs to go on from it — ``previous_response_id``
— and what ``GET /v1/responses/{id}`` returns: the final ``response`` object, the
conversation as the model saw it (chat messages: the earlier turns, this turn's input, this
answer; not the ``instructions``, which OpenAI does not carry over either) and this turn's
input items as the client sent them (``/input_items``).

One key per response, ``meridian:resp:{tenant}:<id>``, with a TTL: the tenant in the key's
hash tag scopes every read to the tenant that stored it (another tenant's id is simply not
found) and keeps a tenant's keys on one Cluster shard. Nothing secret is stored: the key id,
never the key. A record larger than :data:`MAX_RECORD_BYTES` is not stored (the response
then says ``store: false``), so a long conversation cannot grow Redis without bound; each
turn's context is also bounded by the edge's prompt limits, which apply to it as a whole.

Redis down: storing fails soft (the answer goes out, ``store: false``, a counter and a log
line); reading, which a request needs to go on, is a 503 that says why. Every call goes
through the edge's Redis breaker (services/edge/breaker.py, shared with the rate limiter), so
while Redis is down a response does not wait for a connect timeout to be answered.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from services.common.errors import Unavailable
from services.common.logs import event
from services.edge.breaker import Breaker
from services.edge.offload import OFF_LOOP_BYTES, off_loop
from services.edge.redisconn import REDIS_FAILURES, RedisClient

T = TypeVar("T")

log = logging.getLogger("meridian.edge")

#: The largest record kept (JSON bytes): a conversation past it is answered, not stored.
MAX_RECORD_BYTES = 8 * 1024 * 1024
#: How long a stored response is kept, unless the edge is told otherwise (``--responses-ttl-s``).
DEFAULT_TTL_S = 24 * 3600
MAX_TTL_S = 30 * 24 * 3600  # OpenAI keeps them 30 days


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]
    #: Chat messages, as the next turn's context (no instructions).
    context: list[dict[str, Any]]
    #: This turn's input items, in the Responses shape.
    input_items: list[dict[str, Any]]
    #: The record's encoded size (read from Redis; 0 for one not stored yet).
    size: int = field(default=0, compare=False)


def _encoded(record: dict[str, Any]) -> bytes:
    """UTF-8 JSON, not ASCII: a conversation in Korean or Japanese is 3 bytes a character
    rather than the 6 of a ``\\uXXXX`` escape (an emoji 4 rather than 12), so the same
    ``MAX_RECORD_BYTES`` holds twice the conversation and Redis keeps half. A string with a
    lone surrogate (valid JSON, not UTF-8) is written escaped instead."""
    try:
        return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(record, separators=(",", ":")).encode()


def _key(tenant_id: str, response_id: str) -> str:
    return f"meridian:resp:{{{tenant_id}}}:{response_id}"


class ResponseStore:
    """Stored responses of every tenant, one Redis key each (see the module docstring)."""

    def __init__(
        self, redis: RedisClient, *, ttl_s: int = DEFAULT_TTL_S, breaker: Breaker | None = None
    ) -> None:
        if not 1 <= ttl_s <= MAX_TTL_S:
            raise ValueError(f"the responses' TTL must be 1..{MAX_TTL_S} seconds")
        self._redis = redis
        self._breaker = breaker
        self.ttl_s = ttl_s

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await (self._breaker.call(fn) if self._breaker is not None else fn())

    async def get(self, tenant_id: str, response_id: str) -> StoredResponse | None:
        """The stored response, or None; Redis unreachable is a 503."""
        try:
            raw = await self._call(lambda: self._redis.get(_key(tenant_id, response_id)))
        except REDIS_FAILURES as err:
            raise Unavailable(
                "Stored responses cannot be read now (the edge's state store is unreachable); "
                "retry, or send the conversation as input.",
                code="state_store_unavailable",
            ) from err
        if raw is None:
            return None
        # A long conversation is megabytes of JSON: decoded off the loop (services/edge/offload.py).
        data = await off_loop(json.loads, raw) if len(raw) > OFF_LOOP_BYTES else json.loads(raw)
        return StoredResponse(data["response"], data["context"], data["input_items"], len(raw))

    async def put(self, tenant_id: str, stored: StoredResponse, *, size_hint: int = 0) -> bool:
        """Store ``stored``; False (and a log line) when it is too large or Redis fails: the
        answer is still sent, saying ``store: false``. ``size_hint`` (the bytes the caller
        knows the conversation to hold) sends a large record's encoding off the loop."""
        response_id = stored.response["id"]
        record = {
            "response": stored.response,
            "context": stored.context,
            "input_items": stored.input_items,
        }
        raw = await off_loop(_encoded, record) if size_hint > OFF_LOOP_BYTES else _encoded(record)
        if len(raw) > MAX_RECORD_BYTES:
            event(
                log,
                "response.not_stored",
                level=logging.WARNING,
                request_id=response_id,
                reason="too_large",
                bytes=len(raw),
            )
            return False
        try:
            key = _key(tenant_id, response_id)
            await self._call(lambda: self._redis.set(key, raw, ex=self.ttl_s))
        except REDIS_FAILURES as err:
            event(
                log,
                "response.not_stored",
                level=logging.WARNING,
                request_id=response_id,
                reason="redis",
                error=type(err).__name__,
            )
            return False
        return True

    async def delete(self, tenant_id: str, response_id: str) -> bool:
        try:
            return bool(await self._call(lambda: self._redis.delete(_key(tenant_id, response_id))))
        except REDIS_FAILURES as err:
            raise Unavailable(
                "Stored responses cannot be changed now (the edge's state store is "
                "unreachable); retry.",
                code="state_store_unavailable",
            ) from err
