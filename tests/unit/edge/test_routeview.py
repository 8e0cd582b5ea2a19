"""The local ranking rule the edge uses while the router is unreachable (a table of views)."""

from __future__ import annotations

import random

import pytest

from meridian.v1 import router_pb2, worker_pb2
from services.common.clock import ManualClock
from services.common.net import free_port
from services.edge.counters import EdgeCounters
from services.edge.upstream.resilient_router import (
    ResilientRouter,
    ViewConfig,
    models_from_view,
    rank_locally,
)
from services.edge.upstream.router_client import RouterClient, RouterUnreachable

READY = worker_pb2.MODEL_STATE_READY


def worker(
    wid: str,
    *,
    region: str = "kr",
    rtt: float = 5.0,
    running: int = 0,
    max_running: int = 10,
    healthy: bool = True,
    draining: bool = False,
    model: str = "m",
    state: int = READY,
) -> router_pb2.WorkerView:
    w = router_pb2.WorkerView(
        worker_id=wid, region=region, address=f"{wid}:1", healthy=healthy, rtt_ms=rtt
    )
    w.load.running = running
    w.load.max_running = max_running
    w.load.draining = draining
    w.load.models.add(name=model, state=state, max_model_len=4096)
    return w


def rank(
    workers: list[router_pb2.WorkerView],
    *,
    allowed: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    assigned: dict[str, int] | None = None,
) -> list[str]:
    view = router_pb2.RouterView(workers=workers)
    req = router_pb2.RouteRequest(
        model="m", allowed_regions=list(allowed), exclude_worker_ids=list(exclude)
    )
    ranked = rank_locally(view, req, rng=random.Random(1), assigned=assigned or {})
    return [c.worker_id for c in ranked]


@pytest.mark.parametrize(
    ("workers", "kwargs", "expected"),
    [
        ([worker("near", rtt=2), worker("far", rtt=80)], {}, ["near", "far"]),
        ([worker("busy", rtt=2, running=9), worker("idle", rtt=80)], {}, ["idle", "busy"]),
        ([worker("a", rtt=2, running=3), worker("b", rtt=1, running=3)], {}, ["b", "a"]),
        ([worker("sick", healthy=False), worker("ok")], {}, ["ok"]),
        ([worker("leaving", draining=True), worker("ok")], {}, ["ok"]),
        ([worker("other", model="x"), worker("ok")], {}, ["ok"]),
        ([worker("loading", state=worker_pb2.MODEL_STATE_LOADING), worker("ok")], {}, ["ok"]),
        ([worker("kr1"), worker("jp1", region="jp")], {"allowed": ("jp",)}, ["jp1"]),
        ([worker("tried"), worker("ok")], {"exclude": ("tried",)}, ["ok"]),
        (
            [worker("near", rtt=2), worker("far", rtt=80)],
            {"assigned": {"near": 9}},
            ["far", "near"],
        ),
        ([worker("sick", healthy=False)], {}, []),
    ],
)
def test_local_ranking(
    workers: list[router_pb2.WorkerView], kwargs: dict[str, object], expected: list[str]
) -> None:
    assert rank(workers, **kwargs) == expected  # type: ignore[arg-type]


def test_equal_workers_are_ordered_at_random() -> None:
    view = router_pb2.RouterView(workers=[worker(f"w{i}") for i in range(4)])
    req = router_pb2.RouteRequest(model="m")
    firsts = {
        rank_locally(view, req, rng=random.Random(seed), assigned={})[0].worker_id
        for seed in range(40)
    }
    assert len(firsts) > 1


def test_models_are_listed_from_the_view() -> None:
    view = router_pb2.RouterView(
        workers=[
            worker("a", region="kr"),
            worker("b", region="jp"),
            worker("c", region="us", healthy=False),
            worker("d", model="x", state=worker_pb2.MODEL_STATE_LOADING),
        ]
    )
    models = models_from_view(view)
    assert [(m.name, list(m.regions)) for m in models.models] == [("m", ["jp", "kr"])]


async def test_without_a_view_an_unreachable_router_is_a_503() -> None:
    counters = EdgeCounters()
    router = ResilientRouter(
        client=RouterClient(f"127.0.0.1:{free_port()}", timeout_s=0.5),
        clock=ManualClock(),
        counters=counters,
        config=ViewConfig(),
    )
    with pytest.raises(RouterUnreachable) as err:
        await router.route(router_pb2.RouteRequest(model="m"))
    assert err.value.http_status == 503
    assert (counters.router_unreachable, counters.route_fallback_unavailable) == (1, 1)
    assert not await router.ready()
    await router.close()


async def test_load_assigned_while_falling_back_expires_though_no_view_arrives() -> None:
    """A hung router sends no view: what the fallback assigned must not count for the rest of
    the outage (here a burst held to jp would keep other traffic off jp1 long after)."""
    clock = ManualClock()
    router = ResilientRouter(
        client=RouterClient(f"127.0.0.1:{free_port()}", timeout_s=0.5),  # unreachable
        clock=clock,
        counters=EdgeCounters(),
        config=ViewConfig(assigned_ttl_s=5.0),
        rng=random.Random(1),
    )
    router._view = router_pb2.RouterView(
        workers=[worker("kr1", rtt=2), worker("jp1", region="jp", rtt=80)]
    )
    router._view_at = clock.monotonic()  # the last view it had, and the only one it gets
    anywhere = router_pb2.RouteRequest(model="m")
    try:
        for _ in range(20):
            await router.route(router_pb2.RouteRequest(model="m", allowed_regions=["jp"]))
        assert (await router.route(anywhere)).candidates[0].worker_id == "kr1"
        clock.advance(5.0)  # the burst's requests are done by now
        firsts = [(await router.route(anywhere)).candidates[0].worker_id for _ in range(4)]
        assert firsts == ["kr1", "jp1", "kr1", "jp1"]  # spread again, nearest first
    finally:
        await router.close()


@pytest.mark.parametrize(
    ("workers", "ready"),
    [
        ([worker("w", state=worker_pb2.MODEL_STATE_LOADING)], False),  # alive, model loading
        ([worker("w", healthy=False)], False),
        ([worker("w", state=worker_pb2.MODEL_STATE_LOADING), worker("v")], True),
    ],
)
async def test_readiness_from_the_view_needs_a_loaded_model(
    workers: list[router_pb2.WorkerView], ready: bool
) -> None:
    clock = ManualClock()
    router = ResilientRouter(
        client=RouterClient(f"127.0.0.1:{free_port()}", timeout_s=0.5),  # unreachable
        clock=clock,
        counters=EdgeCounters(),
        config=ViewConfig(),
    )
    router._view = router_pb2.RouterView(workers=workers)  # the last view it had, just now
    router._view_at = clock.monotonic()
    assert await router.ready() is ready


def test_while_the_router_is_down_the_view_honours_capabilities() -> None:
    from services.common.capabilities import Capabilities, Needs
    from services.edge.upstream.resilient_router import unsupported_in_view

    chat_only = worker("chat-1")
    embedder = worker("embed-1", region="jp")
    embedder.load.models[0].capabilities.CopyFrom(
        Capabilities(chat=False, embeddings=True, embedding_dimensions=64).to_pb()
    )
    view = router_pb2.RouterView(workers=[chat_only, embedder])
    wants_embedding = router_pb2.RouteRequest(model="m", needs=Needs(endpoint="embeddings").to_pb())
    ranked = rank_locally(view, wants_embedding, rng=random.Random(1), assigned={})
    assert [c.worker_id for c in ranked] == ["embed-1"]
    assert unsupported_in_view(view, wants_embedding) is None
    # Only the chat worker in the allowed region: the router would say unsupported, so does
    # the edge (a 400 naming the field), rather than 503.
    pinned = router_pb2.RouteRequest(
        model="m", allowed_regions=["kr"], needs=Needs(endpoint="embeddings").to_pb()
    )
    assert rank_locally(view, pinned, rng=random.Random(1), assigned={}) == ()
    err = unsupported_in_view(view, pinned)
    assert err is not None
    assert err.param == "input"
    assert err.code == "unsupported_capability"


def _fallback_router(clock: ManualClock) -> ResilientRouter:
    router = ResilientRouter(
        client=RouterClient(f"127.0.0.1:{free_port()}", timeout_s=0.5),  # unreachable
        clock=clock,
        counters=EdgeCounters(),
        config=ViewConfig(assigned_ttl_s=5.0, failed_for_s=5.0),
        rng=random.Random(1),
    )
    router._view = router_pb2.RouterView(
        workers=[
            worker("kr1", rtt=2, max_running=4),
            worker("kr2", rtt=3, max_running=4),
            worker("us1", region="us", rtt=140, max_running=4),
        ]
    )
    router._view_at = clock.monotonic()
    return router


async def test_a_fallback_request_that_ended_no_longer_counts_as_load() -> None:
    """Light traffic (one request at a time) stays on the nearest worker: each request's
    outcome releases its count. Counted until they aged out, 5 s of finished requests made
    every worker look full, and the load steps spread them round-robin over every region."""
    clock = ManualClock()
    router = _fallback_router(clock)
    try:
        firsts = []
        for _ in range(20):
            result = await router.route(router_pb2.RouteRequest(model="m"))
            first = result.candidates[0].worker_id
            firsts.append(first)
            router.report_outcome(
                router_pb2.OutcomeReport(
                    decision_id=result.decision_id,
                    worker_id=first,
                    outcome=router_pb2.OUTCOME_SUCCESS,
                )
            )
            clock.advance(0.2)
        assert firsts == ["kr1"] * 20
        assert router._assigned == {}
    finally:
        await router.close()


async def test_a_worker_seen_failing_is_ranked_last_while_the_router_is_down() -> None:
    """The last view cannot know that kr1 died; the edge's own FAILED outcome does."""
    clock = ManualClock()
    router = _fallback_router(clock)
    try:
        result = await router.route(router_pb2.RouteRequest(model="m"))
        assert result.candidates[0].worker_id == "kr1"
        router.report_outcome(
            router_pb2.OutcomeReport(
                decision_id=result.decision_id, worker_id="kr1", outcome=router_pb2.OUTCOME_FAILED
            )
        )
        again = await router.route(router_pb2.RouteRequest(model="m"))
        assert [c.worker_id for c in again.candidates] == ["kr2", "us1", "kr1"]
        clock.advance(5.0)  # failed_for_s: it may have been restarted
        later = await router.route(router_pb2.RouteRequest(model="m"))
        assert later.candidates[0].worker_id == "kr1"
    finally:
        await router.close()
