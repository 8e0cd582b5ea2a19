from dataclasses import dataclass

import pytest
from aiohttp import web

from services.edge.context import ChatContext
from services.edge.pipeline import CHAT_STAGE_ORDER, Next, build_chain


def test_the_chat_stage_order_is_pinned() -> None:
    assert CHAT_STAGE_ORDER == (
        "connection_guard",
        "authenticate",
        "validate",
        "admit",
        "route",
        "stream",
    )


@dataclass
class Recording:
    """A hand-written stage that records when it ran and passes on."""

    name: str
    seen: list[str]

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse:
        self.seen.append(self.name)
        return await call_next(ctx)


@dataclass
class Terminal:
    seen: list[str]
    name: str = "stream"

    async def __call__(self, ctx: ChatContext) -> web.StreamResponse:
        self.seen.append(self.name)
        return web.Response(text="done")


async def test_stages_run_in_declared_order() -> None:
    seen: list[str] = []
    chain = build_chain(
        [Recording("authenticate", seen), Recording("validate", seen), Recording("route", seen)],
        Terminal(seen),
    )
    resp = await chain(ChatContext(request=None, request_id="r"))  # type: ignore[arg-type]
    assert seen == ["authenticate", "validate", "route", "stream"]
    assert isinstance(resp, web.Response)


def test_out_of_order_stages_are_refused() -> None:
    seen: list[str] = []
    with pytest.raises(ValueError, match="out of order"):
        build_chain([Recording("validate", seen), Recording("authenticate", seen)], Terminal(seen))


def test_unknown_stages_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown"):
        build_chain([Recording("cache", [])], Terminal([]))


def test_duplicate_stages_are_refused() -> None:
    seen: list[str] = []
    with pytest.raises(ValueError, match="out of order"):
        build_chain([Recording("route", seen), Recording("route", seen)], Terminal(seen))


async def test_the_edge_wires_every_declared_stage_in_order(redis_url: str) -> None:
    import redis.asyncio as aioredis

    from services.edge.app import chat_stages
    from services.edge.server import EdgeConfig, EdgeServer
    from services.edge.tenancy.apikeys import KeyHasher
    from services.edge.upstream.router_client import RouterClient

    server = EdgeServer(
        config=EdgeConfig(plain_http=True),
        redis=aioredis.Redis.from_url(redis_url),
        router=RouterClient("127.0.0.1:1"),
        hasher=KeyHasher(b"pipeline-test-pepper"),
    )
    stages, terminal = chat_stages(server.deps)
    assert (*(s.name for s in stages), terminal.name) == CHAT_STAGE_ORDER
    await server.stop()
