"""Polling for a condition that another task or process makes true (tests only)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def eventually(
    predicate: Callable[[], bool], *, timeout_s: float = 5.0, interval_s: float = 0.01
) -> float:
    """Wait until ``predicate()`` holds; return the seconds it took. Raises TimeoutError."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)
