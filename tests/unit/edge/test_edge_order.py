"""The edge's whole order — middlewares, then chat stages — is declared once (pipeline.py) and
pinned here: by name, by what the running app is built from, and by behaviour (as aiohttp's
own tests/test_web_middleware.py pins middleware order by its output)."""

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Handler, Middleware
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from services.common import metric_names as mn
from services.common.clock import ManualClock
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.guard import IpBuckets
from services.edge.middleware.error_boundary import error_boundary
from services.edge.middleware.ip_guard import ip_guard
from services.edge.middleware.telemetry import telemetry_middleware
from services.edge.observability import EdgeTelemetry
from services.edge.pipeline import (
    CHAT_STAGE_ORDER,
    COMPLETIONS_STAGE_ORDER,
    EDGE_ORDER,
    EMBEDDINGS_STAGE_ORDER,
    MIDDLEWARE_ORDER,
    RESPONSES_STAGE_ORDER,
    STAGE_ORDERS,
    Next,
    build_chain,
    ordered_middlewares,
)


def test_the_middleware_order_is_pinned() -> None:
    assert MIDDLEWARE_ORDER == ("telemetry", "error_boundary", "ip_guard")
    assert (*MIDDLEWARE_ORDER, *CHAT_STAGE_ORDER) == EDGE_ORDER


def test_middlewares_must_all_be_given_and_no_other() -> None:
    def mw(name: str) -> Middleware:
        @web.middleware
        async def passing(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await handler(request)

        return passing

    with pytest.raises(ValueError, match=r"missing \['ip_guard'\]"):
        ordered_middlewares({"telemetry": mw("t"), "error_boundary": mw("e")})
    with pytest.raises(ValueError, match=r"unknown \['cache'\]"):
        ordered_middlewares(
            {"telemetry": mw("t"), "error_boundary": mw("e"), "ip_guard": mw("i"), "cache": mw("c")}
        )


def test_the_chat_stage_order_is_pinned() -> None:
    assert CHAT_STAGE_ORDER == (
        "connection_guard",
        "authenticate",
        "validate",
        "admit",
        "route",
        "stream",
    )


def test_every_endpoint_passes_the_same_stages_up_to_its_terminal() -> None:
    assert COMPLETIONS_STAGE_ORDER == CHAT_STAGE_ORDER
    assert RESPONSES_STAGE_ORDER == CHAT_STAGE_ORDER
    assert (*CHAT_STAGE_ORDER[:-1], "embed") == EMBEDDINGS_STAGE_ORDER
    assert set(STAGE_ORDERS) == {"chat", "completions", "responses", "embeddings"}


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

    from services.edge.app import (
        chat_stages,
        completions_stages,
        embeddings_stages,
        responses_stages,
    )
    from services.edge.server import EdgeConfig, EdgeServer
    from services.edge.stages.admit import Admit
    from services.edge.stages.route import Route
    from services.edge.stages.validate import Validate
    from services.edge.tenancy.apikeys import KeyHasher
    from services.edge.upstream.router_client import RouterClient

    server = EdgeServer(
        config=EdgeConfig(plain_http=True),
        redis=aioredis.Redis.from_url(redis_url),
        router=RouterClient("127.0.0.1:1"),
        hasher=KeyHasher(b"pipeline-test-pepper"),
    )
    built = {
        "chat": chat_stages(server.deps),
        "completions": completions_stages(server.deps),
        "responses": responses_stages(server.deps),
        "embeddings": embeddings_stages(server.deps),
    }
    for endpoint, (stages, terminal) in built.items():
        assert (*(s.name for s in stages), terminal.name) == STAGE_ORDERS[endpoint]
        # validate, admit and route speak the endpoint's dialect
        for stage in stages:
            if isinstance(stage, Validate | Admit | Route):
                assert stage._dialect.endpoint == endpoint
    await server.stop()


def statuses(metrics: InMemoryMetricReader) -> dict[int, int]:
    """Requests the telemetry middleware counted, by status."""
    data = metrics.get_metrics_data()
    assert data is not None
    out: dict[int, int] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name != mn.EDGE_REQUESTS:
                    continue
                for point in metric.data.data_points:
                    assert point.attributes is not None
                    status = int(str(point.attributes[mn.STATUS_CODE]))
                    out[status] = out.get(status, 0) + int(getattr(point, "value", 0))
    return out


async def serve(middlewares: list[Middleware]) -> AsyncIterator[str]:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application(middlewares=middlewares)
    app.router.add_get("/ok", ok)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url(""))
    finally:
        await server.close()


def parts() -> tuple[dict[str, Middleware], EdgeCounters, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    counters = EdgeCounters()
    tel = EdgeTelemetry(
        meter=MeterProvider(metric_readers=[reader]).get_meter("test"),
        counters=counters,
        active_streams=lambda: 0,
    )
    one_request = IpBuckets(rate=0.001, burst=1, clock=ManualClock())
    named = {
        "telemetry": telemetry_middleware(tel),
        "error_boundary": error_boundary,
        "ip_guard": ip_guard(buckets=one_request, counters=counters),
    }
    return named, counters, reader


async def two_requests(url: str) -> list[tuple[int, str, dict[str, object]]]:
    out = []
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.get(f"{url}/ok") as resp:
                body = await resp.json(content_type=None)
                out.append((resp.status, resp.headers.get("Retry-After", ""), body))
    return out


async def test_in_the_declared_order_a_flood_gets_an_openai_429_that_telemetry_counts() -> None:
    named, counters, reader = parts()
    async for url in serve(ordered_middlewares(named)):
        first, second = await two_requests(url)
    assert first[0] == 200
    status, retry_after, body = second
    assert status == 429
    assert retry_after
    assert body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert counters.ip_rate_limited == 1
    assert statuses(reader) == {200: 1, 429: 1}


async def test_with_telemetry_inside_the_error_boundary_the_same_429_is_counted_as_a_500() -> None:
    """What the pinned order prevents (the reason for this test's existence): swap the two
    outer middlewares and the client still gets its 429, but telemetry — which then sees the
    exception, not the response — records a server error."""
    named, _, reader = parts()
    swapped = [named["error_boundary"], named["telemetry"], named["ip_guard"]]
    async for url in serve(swapped):
        _, second = await two_requests(url)
    assert second[0] == 429
    assert statuses(reader) == {200: 1, 500: 1}


async def test_the_edge_app_is_built_in_the_declared_middleware_order(redis_url: str) -> None:
    import redis.asyncio as aioredis

    from services.edge.app import build_app
    from services.edge.server import EdgeConfig, EdgeServer
    from services.edge.tenancy.apikeys import KeyHasher
    from services.edge.upstream.router_client import RouterClient

    server = EdgeServer(
        config=EdgeConfig(plain_http=True),
        redis=aioredis.Redis.from_url(redis_url),
        router=RouterClient("127.0.0.1:1"),
        hasher=KeyHasher(b"pipeline-test-pepper"),
    )
    app = build_app(server.deps)
    assert tuple(getattr(m, "__name__", "?") for m in app.middlewares) == MIDDLEWARE_ORDER
    await server.stop()
