"""The router's state and decisions as plain JSON-able dicts, for the debug endpoint.

One function per thing shown, so the debug endpoint and any future exporter agree on names:
field names follow ``proto/meridian/v1/router.proto`` where a proto message exists
(``WorkerView``, ``Candidate``, ``SignalContribution``, ``FilteredWorker``).
"""

from __future__ import annotations

from typing import Any

from meridian.v1 import worker_pb2
from services.common.errors import MeridianError
from services.router.journal import DecisionJournal, JournalEntry, TimingSummary
from services.router.scheduling.types import Decision, RouteQuery, ScoredWorker, WorkerSnapshot


def worker_json(w: WorkerSnapshot, report: worker_pb2.LoadReport | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "worker_id": w.worker_id,
        "region": w.region,
        "address": w.address,
        "healthy": w.healthy,
        "health_detail": w.health_detail,
        "rtt_ms": None if w.rtt_ms is None else round(w.rtt_ms, 3),
        "loss": round(w.loss, 4),
        "report_age_ms": round(w.report_age_s * 1000, 1),
        "in_flight_assigned": w.in_flight,
        # other routers (or an edge on its own) send to it too: in_flight may miss theirs
        "shared": w.shared,
        "recent_failures": w.recent_failures,
        "draining": w.draining,
        "models": [
            {"name": m.name, "state": m.state.value, "max_model_len": m.max_model_len}
            for m in w.models
        ],
        "load": {
            "running": w.running,
            "waiting": w.waiting,
            "max_running": w.max_running,
            "kv_cache_usage": round(w.kv_cache_usage, 4),
            "tokens_per_second": round(w.tokens_per_second, 1),
            "prefix_cache_hit_rate": round(w.prefix_cache_hit_rate, 4),
            "gpu_utilization": w.gpu_utilization,
        },
    }
    if report is not None:
        out["load"]["sequence"] = report.sequence
        out["load"]["sent_unix_ms"] = report.sent_unix_ms
    return out


def query_json(q: RouteQuery) -> dict[str, Any]:
    """The query, without the prefix hashes themselves (only how many there were)."""
    return {
        "request_id": q.request_id,
        "model": q.model,
        "tenant_id": q.tenant_id,
        "priority": q.priority.name.lower(),
        "allowed_regions": sorted(q.allowed_regions),
        "edge_site": q.edge_site,
        "client_region": q.client_region,
        "prompt_tokens": q.prompt_tokens,
        "max_tokens": q.max_tokens,
        "session": bool(q.session_id),
        "prefix_blocks": len(q.prefix_hashes),
        "exclude_worker_ids": sorted(q.exclude_worker_ids),
    }


def candidate_json(s: ScoredWorker) -> dict[str, Any]:
    return {
        "worker_id": s.worker.worker_id,
        "region": s.worker.region,
        "address": s.worker.address,
        "score": round(s.score, 6),
        "contributions": [
            {
                "signal": c.signal,
                "score": round(c.score, 6),
                "weight": c.weight,
                "weighted": round(c.weighted, 6),
                "detail": c.detail,
            }
            for c in s.contributions
        ],
    }


def decision_json(
    decision: Decision,
    query: RouteQuery,
    *,
    decision_id: str,
    decision_us: float,
    error: MeridianError | None,
    explain: bool = True,
) -> dict[str, Any]:
    """A decision as the Route RPC would answer it, plus what an empty one would return."""
    out: dict[str, Any] = {
        "decision_id": decision_id,
        "query": query_json(query),
        "explanation": decision.explanation,
        "decision_us": round(decision_us, 1),
        "candidates": [candidate_json(s) for s in decision.ranked],
    }
    if explain:
        out["filtered"] = [
            {"worker_id": r.worker_id, "region": r.region, "filter": r.filter, "reason": r.reason}
            for r in decision.rejected
        ]
        out["plugin_timings_us"] = {k: round(v, 2) for k, v in decision.plugin_timings_us.items()}
    if error is not None:
        out["error"] = {
            "grpc_status": error.grpc_code.name,
            "empty_reason": decision.empty_reason.value if decision.empty_reason else None,
            "message": error.message,
            "retry_after_s": error.retry_after_s,
        }
    return out


def journal_entry_json(entry: JournalEntry, error: MeridianError | None) -> dict[str, Any]:
    out = decision_json(
        entry.decision,
        entry.query,
        decision_id=entry.decision_id,
        decision_us=entry.decision_us,
        error=error,
        explain=False,
    )
    out["at_unix"] = round(entry.at_unix, 3)
    return out


def counters_json(journal: DecisionJournal) -> dict[str, Any]:
    empty: dict[str, dict[str, int]] = {}
    for (reason, priority), n in sorted(journal.empty_by_reason.items()):
        empty.setdefault(reason, {})[priority] = n
    return {"routed_by_region": dict(sorted(journal.routed_by_region.items())), "empty": empty}


def timings_json(summary: dict[str, TimingSummary]) -> dict[str, Any]:
    return {
        name: {
            "decisions": s.decisions,
            "mean_us": round(s.mean_us, 2),
            "p50_us": round(s.p50_us, 2),
            "p99_us": round(s.p99_us, 2),
            "max_us": round(s.max_us, 2),
        }
        for name, s in summary.items()
    }
