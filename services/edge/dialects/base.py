"""The :class:`Dialect` seam (see the package docstring) and what dialects share."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from meridian.v1 import router_pb2
from services.common.errors import InvalidRequest
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.jsonbody import load_object
from services.edge.openai_types import _first_error, _param_path
from services.edge.request_limits import RequestLimits

M = TypeVar("M", bound=BaseModel)


class Dialect(Protocol):
    """One endpoint, as the shared stages see it."""

    #: "chat" | "completions" | "embeddings": metrics, logs, the request id's prefix.
    endpoint: str
    id_prefix: str

    def accept(
        self, raw: bytes, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> str:
        """Parse and bound the body (a 400 names the field), store it on ``ctx`` with the
        prompt's token estimate; return the model asked for."""
        ...

    async def resolve(
        self, ctx: ChatContext, limits: RequestLimits, counters: EdgeCounters
    ) -> None:
        """What ``accept`` could not do without I/O (the Responses API reads the response a
        request goes on from); after the caller is known. Most dialects have nothing to do."""
        ...

    def completion_budget(self, ctx: ChatContext) -> int | None:
        """Tokens one choice may generate (its max_tokens); None: not set by the client."""
        ...

    def choices(self, ctx: ChatContext) -> int:
        """How many completions the request generates (chat's ``n``, one per prompt)."""
        ...

    def route_request(
        self, ctx: ChatContext, *, site: str, exclude: tuple[str, ...] = ()
    ) -> router_pb2.RouteRequest:
        """What to ask the router for this request (fresh each time)."""
        ...


def parse_body(body: bytes, model: type[M]) -> M:
    """JSON object → ``model``; every failure is a 400 naming the field (as chat's parser)."""
    return validate_object(load_object(body), model)


def validate_object(data: dict[str, Any], model: type[M]) -> M:
    """A parsed JSON object → ``model``, as :func:`parse_body`."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = _first_error(err)
        param = _param_path(tuple(first["loc"]))
        if first["type"] == "missing":
            raise InvalidRequest(f"Missing required parameter: '{param}'.", param=param) from None
        raise InvalidRequest(f"Invalid value for '{param}': {first['msg']}.", param=param) from None


def base_route_request(
    ctx: ChatContext,
    *,
    model: str,
    site: str,
    exclude: tuple[str, ...],
    max_tokens: int,
    prefix_hashes: list[int],
    needs: router_pb2.RequestNeeds,
) -> router_pb2.RouteRequest:
    """The fields every endpoint's route request has (tenant, residency, priority, ...)."""
    assert ctx.principal is not None, "after authenticate"
    tenant = ctx.principal.tenant
    return router_pb2.RouteRequest(
        request_id=ctx.request_id,
        model=model,
        tenant_id=tenant.tenant_id,
        priority=tenant.tier.priority(),
        allowed_regions=list(tenant.allowed_regions),
        edge_site=site,
        prompt_tokens=ctx.prompt_tokens_estimate,
        max_tokens=max_tokens,
        session_id=ctx.session_id,
        prefix_hashes=prefix_hashes,
        exclude_worker_ids=list(exclude),
        needs=needs,
    )
