"""The console feed: bounded, coalescing mailboxes; one upstream stream for every console;
the router's view and decisions as the map's JSON; events from differences."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from meridian.v1 import router_pb2, worker_pb2
from services.common.errors import Overloaded, Unavailable
from services.edge.web import payloads
from services.edge.web.config import Place, WebConfig
from services.edge.web.feed import FleetHub, Mailbox


def frames(data: bytes) -> list[tuple[str, Any]]:
    out = []
    for block in data.decode().strip().split("\n\n"):
        name, payload = block.split("\n", 1)
        out.append((name.removeprefix("event: "), json.loads(payload.removeprefix("data: "))))
    return out


def test_a_slow_reader_gets_the_latest_view_and_the_newest_decisions_with_counts() -> None:
    box = Mailbox(session="s", max_decisions=3, max_events=2)
    box.put(view=b"event: view\ndata: 1\n\n")
    box.put(view=b"event: view\ndata: 2\n\n", decisions=[{"n": i} for i in range(5)])
    box.put(events=[{"e": i} for i in range(3)])
    got = frames(box.take())
    assert got[0] == ("view", 2)
    assert got[1] == ("decisions", [{"n": 2}, {"n": 3}, {"n": 4}])
    assert got[2] == ("events", [{"e": 1}, {"e": 2}])
    assert got[3] == ("stats", {"dropped_decisions": 2, "dropped_events": 1, "coalesced_views": 1})
    assert box.take() == b""  # nothing new, counts already reported


async def test_waiting_wakes_on_mail_or_times_out() -> None:
    box = Mailbox(session="s", max_decisions=3, max_events=3)
    assert await box.wait(0.01) is False
    box.put(decisions=[{"n": 1}])
    assert await box.wait(5) is True
    box.close()
    assert await box.wait(5) is True
    assert box.closed()


def worker(wid: str, region: str, **load: Any) -> router_pb2.WorkerView:
    view = router_pb2.WorkerView(
        worker_id=wid, region=region, healthy=load.pop("healthy", True), rtt_ms=10.0
    )
    models = load.pop("models", [worker_pb2.MODEL_STATE_READY])
    for state in models:
        view.load.models.add(name="m", state=state)
    view.in_flight_assigned = load.pop("in_flight", 0)
    for k, v in {"max_running": 10, **load}.items():
        setattr(view.load, k, v)
    return view


@pytest.mark.parametrize(
    ("view", "removed_by", "state"),
    [
        (worker("a", "kr"), "", "ready"),
        (worker("a", "kr"), "failure-ejection", "ejected"),
        (worker("a", "kr", healthy=False), "", "down"),
        (worker("a", "kr", draining=True), "", "draining"),
        (worker("a", "kr", models=[worker_pb2.MODEL_STATE_DRAINING]), "", "draining"),
        (worker("a", "kr", models=[worker_pb2.MODEL_STATE_LOADING]), "", "loading"),
        (worker("a", "kr", models=[worker_pb2.MODEL_STATE_FAILED]), "", "failed"),
        (worker("a", "kr", models=[]), "", "loading"),
    ],
)
def test_worker_states_as_the_map_colours_them(
    view: router_pb2.WorkerView, removed_by: str, state: str
) -> None:
    assert payloads.worker_state(view, removed_by) == state


def update(
    *workers: router_pb2.WorkerView, filtered: tuple[str, str] | None = None
) -> router_pb2.FleetUpdate:
    u = router_pb2.FleetUpdate()
    u.view.router_site = "seoul"
    u.view.workers.extend(workers)
    if filtered is not None:
        u.latest_filtered.add(worker_id=filtered[0], filter=filtered[1], reason="why")
    return u


CONFIG = WebConfig(places=(Place("seoul", 37.5, 127.0), Place("kr", 37.4, 126.7)))


def test_a_region_is_saturated_when_every_live_worker_in_it_is() -> None:
    full = worker("kr-1", "kr", running=10)
    kv_full = worker("kr-2", "kr", running=1, kv_cache_usage=0.97)
    light = worker("jp-1", "jp", running=2, in_flight=1)
    view = payloads.view_json(update(full, kv_full, light), CONFIG, "seoul")
    by_name = {r["name"]: r for r in view["regions"]}
    assert by_name["kr"]["saturated"] is True
    assert (by_name["kr"]["lat"], by_name["kr"]["lon"]) == (37.4, 126.7)
    assert by_name["jp"]["saturated"] is False
    assert by_name["jp"]["lat"] is None  # no place: listed, not drawn
    jp = next(w for w in view["workers"] if w["id"] == "jp-1")
    assert jp["load"] == pytest.approx(0.3)
    assert view["site"] == {"name": "seoul", "lat": 37.5, "lon": 127.0}


def test_the_admission_filter_marks_a_worker_saturated_and_ejection_marks_it_ejected() -> None:
    view = payloads.view_json(
        update(worker("kr-1", "kr", running=2), filtered=("kr-1", "admission")), CONFIG, "seoul"
    )
    assert view["workers"][0]["saturated"] is True
    view = payloads.view_json(
        update(worker("kr-1", "kr"), filtered=("kr-1", "failure-ejection")), CONFIG, "seoul"
    )
    assert view["workers"][0]["state"] == "ejected"
    assert view["regions"][0]["live"] == 0


def test_events_come_from_state_changes_rejections_and_edge_counters() -> None:
    workers = [
        {
            "id": "a",
            "region": "kr",
            "state": "ejected",
            "filtered_reason": "5 failures",
            "detail": "ok",
        }
    ]
    (change,) = payloads.state_events({"a": "ready"}, workers, 1)
    assert change["kind"] == "ejected"
    assert change["from"] == "ready"
    assert change["detail"] == "5 failures"
    assert payloads.state_events({"a": "ejected"}, workers, 1) == []
    decisions = [
        {"at": 1, "rejected": "saturated", "priority": "low"},
        {"at": 2, "rejected": "saturated", "priority": "low"},
        {"at": 3, "region": "kr", "priority": "low"},
    ]
    (shed,) = payloads.rejection_events(decisions)
    assert (shed["reason"], shed["count"], shed["by"]) == ("saturated", 2, "router")
    before = {"rate_limited_requests": 3, "completions": 9}
    now = {"rate_limited_requests": 5, "completions": 20, "migrations": 1}
    edge = payloads.counter_events(before, now, 7)
    assert [(e["kind"], e["reason"], e["count"]) for e in edge] == [
        ("rejected", "rate_limited_requests", 2)
    ]  # a counter new since the last view counts from its first sighting


class Router:
    """A real implementation of the hub's ``watch`` seam: yields what the test feeds it."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[router_pb2.FleetUpdate | Exception] = asyncio.Queue()
        self.open = 0
        self.opened = 0

    async def watch(
        self, request: router_pb2.WatchFleetRequest
    ) -> AsyncIterator[router_pb2.FleetUpdate]:
        self.open += 1
        self.opened += 1
        try:
            while True:
                item = await self.queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.open -= 1


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_upstream_stream_serves_every_console_and_stops_with_the_last() -> None:
    router = Router()
    hub = FleetHub(watch=router.watch, config=CONFIG, site="seoul", counters=dict)
    one, two = hub.subscribe("s1"), hub.subscribe("s2")
    await settle()
    assert router.open == 1
    decided = update(worker("kr-1", "kr"))
    decided.decisions.add(worker_id="kr-1", region="kr", signal="latency", score=0.7)
    router.queue.put_nowait(decided)
    await settle()
    for box in (one, two):
        names = [n for n, _ in frames(box.take())]
        assert names == ["view", "decisions"]
    late = hub.subscribe("s3")  # a console that opens now gets the last view at once
    assert [n for n, _ in frames(late.take())] == ["view"]
    for box in (one, two, late):
        hub.unsubscribe(box)
    await settle()
    assert router.open == 0
    assert hub.open_streams == 0


async def test_consoles_are_bounded_in_all_and_per_session() -> None:
    router = Router()
    config = WebConfig(max_console_streams=3, max_console_streams_per_session=2)
    hub = FleetHub(watch=router.watch, config=config, site="x", counters=dict)
    hub.subscribe("a")
    hub.subscribe("a")
    with pytest.raises(Overloaded, match="this session"):
        hub.subscribe("a")
    hub.subscribe("b")
    with pytest.raises(Overloaded, match="Too many open consoles"):
        hub.subscribe("c")
    await hub.aclose()
    with pytest.raises(Overloaded, match="shutting down"):
        hub.subscribe("d")


async def test_a_lost_router_feed_is_told_to_the_page_and_retried() -> None:
    router = Router()
    hub = FleetHub(watch=router.watch, config=CONFIG, site="seoul", counters=dict)
    box = hub.subscribe("s")
    await settle()
    router.queue.put_nowait(Unavailable("router gone"))
    await settle()
    (status,) = frames(box.take())
    assert status == ("status", {"router": "unreachable", "detail": "router gone"})
    await asyncio.sleep(0.6)  # the first backoff
    assert router.opened == 2
    router.queue.put_nowait(update(worker("kr-1", "kr")))
    await settle()
    names = dict(frames(box.take()))
    assert names["status"] == {"router": "ok"}
    await hub.aclose()
