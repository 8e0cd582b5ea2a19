"""The planet simulator's one error for bad input: a scenario (or a world table) that cannot be
used, with every problem located (``events[2].region: unknown region 'us-east-9'``).

``ScenarioTooLarge`` is a ``ScenarioError`` raised before anything is built, carrying the memory
estimate, so a run that would not fit is refused up front instead of swapping for an hour.
"""

from __future__ import annotations

from collections.abc import Sequence


class ScenarioError(ValueError):
    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        if len(self.problems) == 1:
            message = f"{source}: {self.problems[0]}"
        else:
            lines = "\n  ".join(self.problems)
            message = f"{source}: {len(self.problems)} problems:\n  {lines}"
        super().__init__(message)


class ScenarioTooLarge(ScenarioError):
    def __init__(self, source: str, estimate_mib: float, limit_mib: float, breakdown: str) -> None:
        self.estimate_mib = estimate_mib
        self.limit_mib = limit_mib
        super().__init__(
            source,
            [
                f"needs about {estimate_mib:,.0f} MiB of memory ({breakdown}), more than the "
                f"limit of {limit_mib:,.0f} MiB (limits.max_memory_mib, or 80 % of this "
                "machine's available memory): shrink the fleet, sites or duration"
            ],
        )
