"""The console's JSON, made from what the router streams (``FleetUpdate``) and what this edge
counts: one function per thing drawn, so the page and the tests agree on every name.

Worker state, as the map colours it (first that applies):

- ``ejected``  — the newest decision's ``failure-ejection`` filter removed it;
- ``down``     — the router considers it unhealthy (stream lost, reports stale);
- ``draining`` — it says so, or a model of it is draining;
- ``loading``  — no model ready yet, one loading;
- ``failed``   — its model failed to load;
- ``ready``    — otherwise.

``saturated``: its load — the larger of batch slots in use ((running + waiting + in-flight
assigned) / max_running) and KV-cache use — is at or above :data:`SATURATED_AT` (the LOW
tier's admission threshold in the default profile), or the newest decision's ``admission``
filter removed it. A region is saturated when every live worker in it is.

Events come from differences: a worker whose state changes (ejected, down, draining, back to
ready…), decisions the router could not place (rejections, by reason and tier), and the
edge's own refusals and migrations (its counters, per view interval).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from meridian.v1 import router_pb2, worker_pb2
from services.edge.web.config import WebConfig

SATURATED_AT = 0.95
_PRIORITY = {
    router_pb2.PRIORITY_UNSPECIFIED: "standard",
    router_pb2.PRIORITY_LOW: "low",
    router_pb2.PRIORITY_STANDARD: "standard",
    router_pb2.PRIORITY_HIGH: "high",
}
#: Edge counters shown as rejection events (a subset of observability.REJECTION_FIELDS that
#: a person acts on), and the ones that count migrations once streams can migrate.
REJECTION_COUNTERS: tuple[str, ...] = (
    "rate_limited_requests",
    "rate_limited_tokens",
    "rate_limited_streams",
    "streams_refused_ip",
    "streams_refused_edge",
    "ip_rate_limited",
    "auth_invalid",
    "invalid_requests",
    "refused_while_draining",
)
MIGRATION_COUNTERS: tuple[str, ...] = ("migrations",)
DEGRADED_COUNTERS: tuple[str, ...] = ("stream_errors", "route_fallback_used")


def worker_state(w: router_pb2.WorkerView, removed_by: str) -> str:
    if removed_by == "failure-ejection":
        return "ejected"
    if not w.healthy:
        return "down"
    states = {m.state for m in w.load.models}
    if w.load.draining or worker_pb2.MODEL_STATE_DRAINING in states:
        return "draining"
    if worker_pb2.MODEL_STATE_READY in states:
        return "ready"
    if worker_pb2.MODEL_STATE_LOADING in states:
        return "loading"
    if worker_pb2.MODEL_STATE_FAILED in states:
        return "failed"
    return "loading"


def worker_json(
    w: router_pb2.WorkerView, filtered: Mapping[str, router_pb2.FilteredWorker]
) -> dict[str, Any]:
    load = w.load
    max_running = max(load.max_running, 1)
    busy = load.running + load.waiting + w.in_flight_assigned
    slots = busy / max_running
    verdict = filtered.get(w.worker_id)
    removed_by = verdict.filter if verdict is not None else ""
    gpus = [g.utilization for g in load.gpus]
    return {
        "id": w.worker_id,
        "region": w.region,
        "state": worker_state(w, removed_by),
        "detail": w.health_detail,
        "filtered_by": removed_by,
        "filtered_reason": verdict.reason if verdict is not None else "",
        "rtt_ms": round(w.rtt_ms, 2) if w.rtt_ms else None,
        "loss": round(w.loss, 4),
        "report_age_ms": round(w.report_age_ms, 1),
        "running": load.running,
        "waiting": load.waiting,
        "max_running": load.max_running,
        "in_flight": w.in_flight_assigned,
        "kv_cache": round(load.kv_cache_usage, 4),
        "tokens_per_s": round(load.tokens_per_second, 1),
        "gpu": round(max(gpus), 4) if gpus else None,
        "load": round(max(slots, load.kv_cache_usage), 4),
        "saturated": w.healthy
        and (max(slots, load.kv_cache_usage) >= SATURATED_AT or removed_by == "admission"),
    }


def view_json(update: router_pb2.FleetUpdate, config: WebConfig, site: str) -> dict[str, Any]:
    """The map's state: the site, every region (with its place when known) and worker."""
    view = update.view
    filtered = {f.worker_id: f for f in update.latest_filtered}
    workers = [worker_json(w, filtered) for w in view.workers]
    by_region: dict[str, list[dict[str, Any]]] = {}
    for w in workers:
        by_region.setdefault(w["region"], []).append(w)
    regions = []
    for name in sorted(by_region):
        members = by_region[name]
        live = [w for w in members if w["state"] in ("ready", "draining")]
        rtts = [w["rtt_ms"] for w in members if w["rtt_ms"] is not None]
        place = config.place(name)
        regions.append(
            {
                "name": name,
                "lat": place.lat if place else None,
                "lon": place.lon if place else None,
                "workers": [w["id"] for w in members],
                "live": len(live),
                "saturated": bool(live) and all(w["saturated"] for w in live),
                "load": round(sum(w["load"] for w in live) / len(live), 4) if live else None,
                "rtt_ms": round(min(rtts), 2) if rtts else None,
                "tokens_per_s": round(sum(w["tokens_per_s"] for w in members), 1),
            }
        )
    here = config.place(view.router_site or site)
    return {
        "site": {
            "name": view.router_site or site,
            "lat": here.lat if here else None,
            "lon": here.lon if here else None,
        },
        "generated_unix_ms": view.generated_unix_ms,
        "regions": regions,
        "workers": workers,
    }


def decision_json(d: router_pb2.DecisionSummary) -> dict[str, Any]:
    out: dict[str, Any] = {
        "at": d.at_unix_ms,
        "model": d.model,
        "priority": _PRIORITY.get(d.priority, "standard"),
        "reroute": d.reroute,
    }
    if d.empty_reason:
        out["rejected"] = d.empty_reason
        return out
    out.update(
        worker=d.worker_id,
        region=d.region,
        score=round(d.score, 4),
        signal=d.signal,
        runner_up=d.runner_up_worker_id or None,
        runner_up_region=d.runner_up_region or None,
        runner_up_score=round(d.runner_up_score, 4) if d.runner_up_worker_id else None,
    )
    return out


def state_events(
    before: Mapping[str, str], workers: Sequence[Mapping[str, Any]], at_ms: int
) -> list[dict[str, Any]]:
    """One event per worker whose state changed since ``before`` (worker id → state)."""
    out = []
    for w in workers:
        old = before.get(w["id"])
        if old is not None and old != w["state"]:
            out.append(
                {
                    "at": at_ms,
                    "kind": w["state"] if w["state"] != "ready" else "recovered",
                    "worker": w["id"],
                    "region": w["region"],
                    "from": old,
                    "detail": w["filtered_reason"] or w["detail"],
                }
            )
    return out


def rejection_events(decisions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The router's empty decisions, grouped by (reason, tier) within one update."""
    counts: dict[tuple[str, str], tuple[int, int]] = {}
    for d in decisions:
        if "rejected" in d:
            key = (d["rejected"], d["priority"])
            n, _ = counts.get(key, (0, 0))
            counts[key] = (n + 1, d["at"])
    return [
        {
            "at": at,
            "kind": "rejected",
            "reason": reason,
            "priority": tier,
            "count": n,
            "by": "router",
        }
        for (reason, tier), (n, at) in counts.items()
    ]


def counter_events(
    before: Mapping[str, int], now: Mapping[str, int], at_ms: int
) -> list[dict[str, Any]]:
    """The edge's own refusals, failovers and migrations since the last view."""
    out = []
    for kind, fields in (
        ("rejected", REJECTION_COUNTERS),
        ("migrated", MIGRATION_COUNTERS),
        ("degraded", DEGRADED_COUNTERS),
    ):
        for name in fields:
            if name not in now:
                continue
            delta = now[name] - before.get(name, now[name])
            if delta > 0:
                out.append(
                    {"at": at_ms, "kind": kind, "reason": name, "count": delta, "by": "edge"}
                )
    return out
