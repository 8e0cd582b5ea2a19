"""The drain deadline's cut (services/edge/guard.py: ``Lifecycle``, ``CutScope``): the edge
knows every API request in flight, waits for them, and at the deadline ends each in its
innermost scope with ``ShuttingDown`` — the scope whose stage can still tell the client. A
client that leaves at the same moment stays a cancellation; a timeout of the request's own
stays a timeout. Behind the connection guard and the error boundary, a cut request that has
sent nothing is a 503 in OpenAI's format."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.guard import Cut, Lifecycle, Occupancy, cut_scope
from services.edge.httperrors import ShuttingDown
from services.edge.middleware.error_boundary import error_boundary
from services.edge.pipeline import build_chain
from services.edge.stages.connection_guard import ConnectionGuard
from tests.support.wait import eventually


async def _started(lifecycle: Lifecycle, n: int = 1) -> None:
    await eventually(lambda: lifecycle.in_flight == n, timeout_s=2.0)


async def test_the_cut_reaches_the_innermost_scope_which_can_still_answer() -> None:
    lifecycle = Lifecycle()

    async def request() -> str:
        async with lifecycle.request() as flight:
            flight.streaming = True
            try:
                async with cut_scope(flight):
                    await asyncio.sleep(30)
            except ShuttingDown as err:
                await asyncio.sleep(0)  # awaiting still works: the last event can be written
                return err.to_openai()["error"]["code"] or ""
            return "not cut"

    task = asyncio.create_task(request())
    await _started(lifecycle)
    assert not await lifecycle.wait_idle(0.01)
    assert lifecycle.cut() == Cut(streams=1, requests=0)
    assert await asyncio.wait_for(task, 1.0) == "edge_shutting_down"
    assert await lifecycle.wait_idle(1.0)
    assert lifecycle.in_flight == 0


async def test_a_request_outside_any_inner_scope_is_cut_in_the_outer_one() -> None:
    lifecycle = Lifecycle()
    cleaned = asyncio.Event()

    async def request() -> None:
        async with lifecycle.request():
            try:
                await asyncio.sleep(30)
            finally:
                cleaned.set()  # its stages' finally clauses run (cancel the worker, settle)

    task = asyncio.create_task(request())
    await _started(lifecycle)
    assert lifecycle.cut() == Cut(streams=0, requests=1)
    with pytest.raises(ShuttingDown, match="shutting down"):
        await asyncio.wait_for(task, 1.0)
    assert cleaned.is_set()


async def test_a_client_that_leaves_as_the_cut_comes_is_a_cancellation() -> None:
    lifecycle = Lifecycle()

    async def request() -> None:
        async with lifecycle.request() as flight, cut_scope(flight):
            await asyncio.sleep(30)

    task = asyncio.create_task(request())
    await _started(lifecycle)
    lifecycle.cut()
    task.cancel()  # aiohttp cancels the handler of a connection that closed
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_timeout_of_the_request_s_own_is_not_a_cut() -> None:
    lifecycle = Lifecycle()

    async def own_timeout() -> None:
        async with lifecycle.request() as flight, cut_scope(flight), asyncio.timeout(0.01):
            await asyncio.sleep(30)

    with pytest.raises(TimeoutError):
        await own_timeout()

    async def cut_inside_a_write_timeout() -> None:
        async with lifecycle.request() as flight, cut_scope(flight), asyncio.timeout(30):
            await asyncio.sleep(30)

    task = asyncio.create_task(cut_inside_a_write_timeout())
    await _started(lifecycle)
    lifecycle.cut()
    with pytest.raises(ShuttingDown):
        await asyncio.wait_for(task, 1.0)


async def test_nothing_to_wait_for_is_idle_at_once_and_a_cut_of_nothing_is_empty() -> None:
    lifecycle = Lifecycle()
    assert await lifecycle.wait_idle(0.0)
    assert lifecycle.cut() == Cut(streams=0, requests=0)


async def test_a_cut_request_with_no_response_yet_is_an_openai_503() -> None:
    counters, lifecycle = EdgeCounters(), Lifecycle()
    streams = Occupancy(max_total=10, max_per_ip=10)

    class Hold:
        name = "stream"

        async def __call__(self, ctx: ChatContext) -> web.StreamResponse:
            await asyncio.sleep(30)
            return web.json_response({"ok": True})

    chain = build_chain(
        [ConnectionGuard(streams=streams, lifecycle=lifecycle, counters=counters)], Hold()
    )

    async def handle(request: web.Request) -> web.StreamResponse:
        return await chain(ChatContext(request=request, request_id="r"))

    app = web.Application(middlewares=[error_boundary])
    app.router.add_post("/chat", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with aiohttp.ClientSession() as http:
            pending = asyncio.create_task(
                http.post(f"http://127.0.0.1:{runner.addresses[0][1]}/chat")
            )
            await _started(lifecycle)
            lifecycle.draining = True
            assert lifecycle.cut() == Cut(streams=0, requests=1)
            async with await asyncio.wait_for(pending, 2.0) as resp:
                assert resp.status == 503
                assert resp.headers["Retry-After"] == "1"
                error = (await resp.json())["error"]
        assert error["type"] == "service_unavailable"
        assert error["code"] == "edge_shutting_down"
        assert "shutting down" in error["message"]
        assert streams.total == 0  # the stream slot is given back
        assert lifecycle.in_flight == 0
    finally:
        await runner.cleanup()
