"""The data the scheduling framework works on: one request (``RouteQuery``), the router's view of
each worker at decision time (``WorkerSnapshot``), and the outcome (``Decision``).

These are plain immutable records (``services.common.records.record``: frozen dataclasses to
the type checker, without frozen's per-field cost at run time — the router builds a snapshot
per worker per load report) so that plugins are pure functions of their inputs and tests are
tables of inline worker states. The router's fleet builds snapshots from load
reports and probes; the scheduler never touches sockets.
"""

from __future__ import annotations

import enum
from dataclasses import field

from services.common.capabilities import CHAT, CHAT_ONLY, Capabilities, Needs
from services.common.records import record


class Priority(enum.IntEnum):
    """Service tier. Mirrors ``meridian.v1.Priority`` (UNSPECIFIED is read as STANDARD)."""

    LOW = 1
    STANDARD = 2
    HIGH = 3


class ModelState(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


@record
class ModelStatus:
    name: str
    state: ModelState
    max_model_len: int = 0
    # What this model on this worker supports (the ``capability`` filter's input).
    capabilities: Capabilities = CHAT_ONLY
    # When it came up READY on the worker (unix s; 0: unknown): /v1/models' "created".
    created_unix_s: int = 0


@record
class RouteQuery:
    """One routing question. The prompt itself never reaches the router; only its size and
    hashes of its leading blocks do."""

    request_id: str
    model: str
    tenant_id: str = ""
    priority: Priority = Priority.STANDARD
    allowed_regions: frozenset[str] = frozenset()  # empty: any region
    edge_site: str = ""
    client_region: str = ""
    prompt_tokens: int = 0
    max_tokens: int = 0
    session_id: str = ""
    prefix_hashes: tuple[int, ...] = ()
    exclude_worker_ids: frozenset[str] = frozenset()
    needs: Needs = CHAT  # what the request needs of a worker (the ``capability`` filter)


@record
class WorkerSnapshot:
    """What this router knows about one worker at one instant.

    ``rtt_ms``/``loss`` are measured by this router (its site's view of the network);
    ``in_flight`` counts requests this router assigned that the worker has not yet reported, so
    a burst between two load reports does not herd onto the same worker. ``shared``: requests
    this router did not make reach the worker too (another router replica's, or the edge's own
    while the router was away) — the last report that named admitted requests named one of
    theirs, or the worker does not name them at all — so its counts between two reports can be
    short by requests no one here can see. ``False`` while the worker's admission lists have
    named only this router's requests (or none yet): then ``in_flight`` is exact.
    """

    worker_id: str
    region: str
    address: str
    healthy: bool = True
    health_detail: str = "ok"
    models: tuple[ModelStatus, ...] = ()
    draining: bool = False
    rtt_ms: float | None = None  # None: not measured yet
    loss: float = 0.0  # 0..1
    report_age_s: float = 0.0
    running: int = 0
    waiting: int = 0
    max_running: int = 1
    kv_cache_usage: float = 0.0  # 0..1
    tokens_per_second: float = 0.0
    prefix_cache_hit_rate: float = 0.0
    gpu_utilization: float | None = None  # 0..1, None on hosts without NVML
    in_flight: int = 0
    recent_failures: int = 0
    shared: bool = True  # (unknown: as a worker that sends no admission lists)
    #: For each of ``recent_failures``, oldest first: seconds until it leaves the fleet's
    #: failure window, as of the snapshot (at most the fleet's ``snapshot_max_age_s``, 1 s by
    #: default, stale); empty where nobody keeps the times. What a 503 after ejection says to wait.
    failures_clear_in_s: tuple[float, ...] = ()

    def model(self, name: str) -> ModelStatus | None:
        for m in self.models:
            if m.name == name:
                return m
        return None


@record
class Contribution:
    """One scorer's part in one candidate's total."""

    signal: str
    score: float  # the scorer's clamped score, 0..1
    weight: float
    weighted: float  # score × weight / Σ weights
    detail: str = ""


@record
class ScoredWorker:
    worker: WorkerSnapshot
    score: float  # Σ weighted, 0..1
    contributions: tuple[Contribution, ...] = ()


@record
class Rejection:
    """A worker a filter removed, and why (for explanations)."""

    worker_id: str
    region: str
    filter: str
    reason: str


class NoCandidate(enum.StrEnum):
    """Why a decision came back empty; the router maps each to its gRPC status."""

    UNKNOWN_MODEL = "unknown_model"  # NOT_FOUND
    REGION_NOT_ALLOWED = "region_not_allowed"  # FAILED_PRECONDITION (residency)
    SATURATED = "saturated"  # RESOURCE_EXHAUSTED (admission/shedding)
    UNAVAILABLE = "unavailable"  # UNAVAILABLE (nothing healthy and ready)
    # INVALID_ARGUMENT: served, but no worker (in the allowed regions) has a feature it needs
    UNSUPPORTED = "unsupported"


@record
class Decision:
    ranked: tuple[ScoredWorker, ...]
    rejected: tuple[Rejection, ...] = ()
    explanation: str = ""
    empty_reason: NoCandidate | None = None
    retry_after_s: float | None = None
    plugin_timings_us: dict[str, float] = field(default_factory=dict)
