"""Every metric Meridian exports, named once.

Services create their instruments from these constants; the Grafana dashboard and the
Prometheus alerting rules refer to their Prometheus names, and a test checks both against what
the services really export after traffic, so a rename cannot silently break a dashboard.

Names follow the OpenTelemetry GenAI semantic conventions where one exists
(``gen_ai.server.time_to_first_token`` …); the rest are ``meridian.<service>.<what>``.
Attributes use semconv keys where they exist (``gen_ai.request.model``,
``http.response.status_code``, ``error.type``) and ``meridian.*`` otherwise.
"""

from __future__ import annotations

from typing import Final

# --- attributes ---------------------------------------------------------------------------
MODEL: Final = "gen_ai.request.model"
TOKEN_TYPE: Final = "gen_ai.token.type"  # "input" | "output"
STATUS_CODE: Final = "http.response.status_code"
ERROR_TYPE: Final = "error.type"
REGION: Final = "meridian.region"
WORKER: Final = "meridian.worker"
SIGNAL: Final = "meridian.signal"
REASON: Final = "meridian.reason"
PLUGIN: Final = "meridian.plugin"
FINISH: Final = "gen_ai.response.finish_reason"
STAGE: Final = "meridian.stage"
OUTCOME: Final = "meridian.outcome"
TRIGGER: Final = "meridian.trigger"
OPERATION: Final = "gen_ai.operation.name"  # "chat" | "text_completion" | "embeddings"

# --- GenAI semantic conventions (edge: as the client sees it; worker: inside the engine) ----
TTFT: Final = "gen_ai.server.time_to_first_token"  # s
TPOT: Final = "gen_ai.server.time_per_output_token"  # s (inter-token latency)
REQUEST_DURATION: Final = "gen_ai.server.request.duration"  # s
TOKEN_USAGE: Final = "gen_ai.client.token.usage"  # tokens per request, by TOKEN_TYPE

# --- edge -----------------------------------------------------------------------------------
EDGE_REQUESTS: Final = "meridian.edge.requests"  # by STATUS_CODE, ERROR_TYPE
EDGE_REJECTIONS: Final = "meridian.edge.rejections"  # by REASON (rate limits, abuse, auth)
EDGE_ACTIVE_STREAMS: Final = "meridian.edge.active_streams"
EDGE_LOOP_STALLED: Final = "meridian.edge.event_loop.stalled"  # s the loop could not run a timer
EDGE_FAILOVERS: Final = "meridian.edge.failovers"  # attempts beyond the first, by REGION
EDGE_MIGRATIONS: Final = "meridian.edge.migrations"  # by TRIGGER and OUTCOME
EDGE_MIGRATION_GAP: Final = "meridian.edge.migration.gap"  # s the client saw without a token
EDGE_DEGRADED: Final = "meridian.edge.degraded"  # fallbacks used, by REASON
EDGE_CONSOLE_STREAMS: Final = "meridian.edge.console.streams"  # open /console/events streams
EDGE_CONSOLE_DROPPED: Final = "meridian.edge.console.dropped"  # for slow consoles (open ones)
EDGE_CONSOLE_BYTES: Final = "meridian.edge.console.bytes"  # console event bytes sent

# --- router ---------------------------------------------------------------------------------
ROUTER_DECISIONS: Final = "meridian.router.decisions"  # by REGION and deciding SIGNAL
ROUTER_EMPTY: Final = "meridian.router.empty_decisions"  # by REASON
ROUTER_DECISION_DURATION: Final = "meridian.router.decision.duration"  # us
ROUTER_PLUGIN_DURATION: Final = "meridian.router.plugin.duration"  # us, by PLUGIN
ROUTER_WORKERS: Final = "meridian.router.workers"  # healthy workers, by REGION
ROUTER_OUTCOMES_REFUSED: Final = "meridian.router.outcomes.refused"  # malformed, by REASON

# --- worker ---------------------------------------------------------------------------------
WORKER_REQUESTS: Final = "meridian.worker.requests"  # by FINISH
WORKER_TOOL_CALLS: Final = "meridian.worker.tool_calls"  # tool calls the engine returned
WORKER_DROPPED_MESSAGES: Final = "meridian.worker.dropped_messages"  # truncate_oldest
EDGE_TOOL_CALLS: Final = "meridian.edge.tool_calls"  # tool calls sent to clients
EDGE_FEATURE_REQUESTS: Final = "meridian.edge.feature_requests"  # by FEATURE
FEATURE: Final = "meridian.feature"  # tools | json_object | json_schema | n
WORKER_QUEUE_TIME: Final = "meridian.worker.queue_time"  # s
WORKER_RUNNING: Final = "meridian.worker.running"
WORKER_WAITING: Final = "meridian.worker.waiting"
WORKER_KV_CACHE: Final = "meridian.worker.kv_cache_usage"  # 0..1
WORKER_GPU: Final = "meridian.worker.gpu_utilization"  # 0..1
WORKER_TOKENS_PER_SECOND: Final = "meridian.worker.tokens_per_second"
WORKER_EMBED_DURATION: Final = "meridian.worker.embed.duration"  # s, by OUTCOME
WORKER_EMBED_INPUTS: Final = "meridian.worker.embed.inputs"  # inputs embedded
# the openai engine (services/worker/upstream/): the upstream server it fronts
WORKER_UPSTREAM_REQUESTS: Final = "meridian.worker.upstream.requests"  # by OUTCOME
WORKER_UPSTREAM_TTFT: Final = "meridian.worker.upstream.time_to_first_token"  # s


def prometheus_name(otel_name: str, unit: str = "", *, counter: bool = False) -> str:
    """The name the OpenTelemetry Prometheus exporter gives an instrument (dots → underscores,
    unit suffix, ``_total`` on counters), as dashboards must spell it."""
    name = otel_name.replace(".", "_")
    units = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "1": ""}
    suffix = "" if unit.startswith("{") else units.get(unit, unit)
    if suffix and not name.endswith(suffix):
        name = f"{name}_{suffix}"
    if counter:
        name += "_total"
    return name
