"""Every event the edge counts, in one typed object per edge process.

Each field is a monotonically increasing count (named after what happened, not where), so a
typo is a type error rather than a silently new metric. The admin port serves them as JSON
(``GET /admin/stats``); the OpenTelemetry issue will export the same fields as Prometheus
counters from this one module.

Gauges (live connections and streams) are not counters: they are read from the objects that
own them when the stats are rendered.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class EdgeCounters:
    # Connections and abuse limits (protocol level and connection_guard stage).
    connections_accepted: int = 0
    connections_refused_ip: int = 0
    connections_refused_edge: int = 0
    header_timeouts: int = 0
    bad_http_requests: int = 0
    headers_too_large: int = 0
    body_timeouts: int = 0
    bodies_too_large: int = 0
    write_timeouts: int = 0
    ip_rate_limited: int = 0
    streams_refused_ip: int = 0
    streams_refused_edge: int = 0
    refused_while_draining: int = 0
    # Authentication.
    auth_missing: int = 0
    auth_malformed: int = 0
    auth_invalid: int = 0
    auth_disabled_tenant: int = 0
    auth_cache_hits: int = 0
    auth_lookups: int = 0
    auth_stale_served: int = 0
    auth_unavailable: int = 0
    auth_invalidations: int = 0
    # Validation and policy.
    invalid_requests: int = 0
    models_not_allowed: int = 0
    too_many_messages: int = 0
    prompts_too_long: int = 0
    # Admission (rate limits).
    admitted: int = 0
    rate_limited_requests: int = 0
    rate_limited_tokens: int = 0
    rate_limited_streams: int = 0
    rate_limited_too_large: int = 0
    rate_limited_locally: int = 0
    limiter_redis_errors: int = 0
    limiter_fail_open: int = 0
    limiter_fail_closed: int = 0
    settle_failures: int = 0
    settle_retries: int = 0
    settles_resent: int = 0
    # Requests admitted fail-open, written into Redis's windows once it answered again
    # (services/edge/ratelimit/limiter.py), those whose window had passed by then, and live
    # ones whose reservation and stream slot moved to Redis.
    limiter_charged_back: int = 0
    limiter_charges_dropped: int = 0
    limiter_leases_adopted: int = 0
    lease_renew_failures: int = 0
    redis_breaker_opened: int = 0
    # Redis timeouts that this process's own event-loop stall explains (the call was retried
    # instead of opening the breaker; services/edge/breaker.py).
    redis_timeouts_in_stalls: int = 0
    # Routing.
    router_unreachable: int = 0
    route_fallback_used: int = 0
    route_fallback_unavailable: int = 0
    # Requests that did not ask the router because it had not answered and was backed off
    # (services/edge/upstream/resilient_router.py); each is also one of the two above.
    route_fallback_backed_off: int = 0
    view_refreshes: int = 0
    view_refresh_failures: int = 0
    # Streaming.
    completions: int = 0
    embeddings: int = 0  # embeddings requests answered
    client_disconnects: int = 0
    stream_errors: int = 0
    # Still running when the drain grace ended, and cut (services/edge/guard.py: Lifecycle):
    # SSE streams (ended with an error event) and requests with no response yet (a 503).
    drain_streams_cut: int = 0
    drain_requests_cut: int = 0
    # Running under a key that was revoked (or a tenant disabled) meanwhile, and cut
    # (services/edge/tenancy/revocation.py); the Redis re-checks that decided it.
    revoked_streams_cut: int = 0
    revoked_requests_cut: int = 0
    auth_rechecks: int = 0
    # Chunks held while a client was behind and sent inside another's SSE event
    # (services/edge/chunk_merge.py), and the merged events that carried them.
    chunks_merged: int = 0
    merged_events: int = 0
    # The mux transport (services/edge/upstream/mux.py): GenerateMux calls opened and broken
    # (the worker died or the connection dropped), frames read and the stream events in them
    # (events per frame: how many streams one message served).
    mux_calls_opened: int = 0
    mux_calls_broken: int = 0
    mux_frames: int = 0
    mux_events: int = 0
    # Chat-completions breadth: requests that asked for each feature, and calls returned.
    tool_requests: int = 0
    structured_output_requests: int = 0
    multi_choice_requests: int = 0
    tool_calls_returned: int = 0
    # The Responses API's stored responses (services/edge/responses_store.py): kept, and
    # asked to be kept but not (too large, Redis unreachable: answered with store false).
    responses_stored: int = 0
    responses_not_stored: int = 0
    # Mid-stream migration (services/edge/migration/): streams moved to another worker, and
    # breaks that could not be moved (refused, a bound reached, no worker left).
    migrations: int = 0
    migrations_failed: int = 0

    def snapshot(self) -> dict[str, int]:
        return asdict(self)

    def add(self, other: EdgeCounters) -> None:
        """Count what ``other`` counted (work done off the event loop counts into its own
        object, added back on the loop, so no count is lost to a race)."""
        for name in self.__slots__:
            if value := getattr(other, name):
                setattr(self, name, getattr(self, name) + value)
