"""How far the edge goes to keep a broken stream alive (``--migration-*`` flags)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationPolicy:
    """Bounds on mid-stream migration. Every one is finite: a stream is moved at most
    ``max_migrations`` times, only while it has delivered at most ``max_resumable_tokens``
    tokens (a longer prefix costs the new worker a long prefill), and it ends with an error
    once the client has waited ``max_gap_s`` without a token (across all attempts of one
    migration). A worker that sends nothing for ``stall_s`` after the first token is treated
    as broken (frozen process, black-holed link)."""

    enabled: bool = True
    max_migrations: int = 3
    max_resumable_tokens: int = 32768
    max_gap_s: float = 20.0
    stall_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_migrations < 1:
            raise ValueError(f"max_migrations must be >= 1, got {self.max_migrations}")
        if self.max_resumable_tokens < 1:
            raise ValueError(f"max_resumable_tokens must be >= 1, got {self.max_resumable_tokens}")
        if not self.max_gap_s > 0 or not self.stall_s > 0:
            raise ValueError("max_gap_s and stall_s must be > 0")
        if self.stall_s >= self.max_gap_s:
            raise ValueError(
                f"stall_s ({self.stall_s}) must be below max_gap_s ({self.max_gap_s}): "
                "a stall must be detected before the gap budget is spent"
            )


#: Migration off: a break after the first token ends the stream with an error event.
DISABLED = MigrationPolicy(enabled=False)
