"""What broke a stream, named for spans, metrics and logs."""

from __future__ import annotations

import enum

from services.common.errors import MeridianError, UpstreamTimeout


class Trigger(enum.StrEnum):
    #: The connection to the worker dropped or the call failed (process died, link cut).
    WORKER_LOST = "worker_lost"
    #: Nothing for ``stall_s`` after the first token (frozen process, black-holed link).
    STALL = "stall"
    #: The worker handed the stream back (its drain grace ended, its engine shut down).
    HANDOFF = "handoff"


class Outcome(enum.StrEnum):
    MIGRATED = "migrated"
    #: The request cannot be carried (migration_refusal), or migration is off.
    REFUSED = "refused"
    #: A bound was reached: attempts, resumable length, time without tokens.
    EXHAUSTED = "exhausted"
    #: No other worker could continue it.
    FAILED = "failed"
    #: The client left during the migration.
    CANCELLED = "cancelled"


def trigger_of(err: MeridianError) -> Trigger:
    return Trigger.STALL if isinstance(err, UpstreamTimeout) else Trigger.WORKER_LOST
