"""How far a worker is beyond the nearest candidate — the gate both affinity scorers apply.

Affinity (a warm prefix, a conversation's last worker) is worth some prefill; a far region
costs its whole extra round trip on every first token. Past ``max_extra_rtt_ms`` above the
nearest candidate's measured RTT, affinity stops counting. An unmeasured RTT is no evidence of
distance and passes. The nearest RTT is ``Candidates.nearest_rtt_ms()`` (once per decision).
"""

from __future__ import annotations

from services.router.scheduling.types import WorkerSnapshot


def too_far(worker: WorkerSnapshot, nearest_ms: float | None, max_extra_rtt_ms: float) -> bool:
    return (
        nearest_ms is not None
        and worker.rtt_ms is not None
        and worker.rtt_ms > nearest_ms + max_extra_rtt_ms
    )
