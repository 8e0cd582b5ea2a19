"""The limit algorithm in process (see :mod:`.types`): the fail-open fallback when Redis is
unreachable, and the executable specification that the Lua script is tested against (one
table of cases runs on both).

Every operation is O(expired entries + live leases of the scope); the per-scope state is
dropped once it holds nothing, so memory follows live traffic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.edge.ratelimit.types import Ask, Reason, ScopeState, Verdict, limit_args

STREAM_RETRY_MS = 1000  # a stream slot frees whenever some stream ends: suggest a second


@dataclass(slots=True)
class _ScopeLog:
    entries: deque[tuple[int, str]] = field(default_factory=deque)  # (admitted_ms, id)
    tokens: dict[str, int] = field(default_factory=dict)
    total: int = 0
    leases: dict[str, int] = field(default_factory=dict)  # id -> expires_ms

    def purge(self, now_ms: int, window_ms: int) -> None:
        cutoff = now_ms - window_ms
        while self.entries and self.entries[0][0] <= cutoff:
            _, rid = self.entries.popleft()
            self.total -= self.tokens.pop(rid, 0)
        expired = [rid for rid, until in self.leases.items() if until <= now_ms]
        for rid in expired:
            del self.leases[rid]

    def reset_ms(self, now_ms: int, window_ms: int) -> int:
        return self.entries[0][0] + window_ms - now_ms if self.entries else 0

    def tokens_retry_ms(self, need: int, tpm: int, now_ms: int, window_ms: int) -> int:
        """Until enough of the oldest reservations leave the window for ``need`` to fit."""
        excess = self.total + need - tpm
        freed = 0
        for ts, rid in self.entries:
            freed += self.tokens.get(rid, 0)
            if freed >= excess:
                return ts + window_ms - now_ms
        return window_ms

    def empty(self) -> bool:
        return not self.entries and not self.leases


class LocalBackend:
    name = "local"

    def __init__(self, *, window_ms: int, lease_ms: int) -> None:
        if window_ms < 1 or lease_ms < 1:
            raise ValueError("window_ms and lease_ms must be >= 1")
        self._window_ms = window_ms
        self._lease_ms = lease_ms
        self._scopes: dict[str, _ScopeLog] = {}

    def scope_count(self) -> int:
        return len(self._scopes)

    async def admit(self, ask: Ask, now_ms: int) -> Verdict:
        return self.admit_now(ask, now_ms)

    def admit_now(self, ask: Ask, now_ms: int) -> Verdict:
        window = self._window_ms
        logs = [self._scopes.get(s.id) or _ScopeLog() for s in ask.scopes]
        reason: Reason | None = None
        scope_index = -1
        retry = 0

        def deny(r: Reason, index: int, ms: int) -> None:
            nonlocal reason, scope_index, retry
            if reason is None:
                reason, scope_index = r, index
            retry = max(retry, ms)

        for log in logs:
            log.purge(now_ms, window)
        # Already admitted (a retry whose first answer was lost): admitted again, not charged
        # again — the Lua script does the same.
        again = any(ask.request_id in log.tokens or ask.request_id in log.leases for log in logs)
        states: list[ScopeState] = []
        for i, (scope, log) in enumerate(zip(ask.scopes, logs, strict=True)):
            rpm, tpm, max_streams = limit_args(scope.limits)
            if again:
                pass  # the counts already hold this request
            elif tpm and ask.tokens > tpm:
                deny(Reason.TOO_LARGE, i, 0)
            else:
                if rpm and len(log.entries) + 1 > rpm:
                    deny(Reason.REQUESTS, i, log.reset_ms(now_ms, window))
                if tpm and log.total + ask.tokens > tpm:
                    deny(Reason.TOKENS, i, log.tokens_retry_ms(ask.tokens, tpm, now_ms, window))
            if max_streams and not again and len(log.leases) + 1 > max_streams:
                deny(Reason.STREAMS, i, STREAM_RETRY_MS)
            states.append(
                ScopeState(
                    len(log.entries), log.total, len(log.leases), log.reset_ms(now_ms, window)
                )
            )
        if reason is not None:
            self._forget_empty(ask)
            return Verdict(False, tuple(states), reason, scope_index, retry)
        if again:
            return Verdict(True, tuple(states))
        for i, (scope, log) in enumerate(zip(ask.scopes, logs, strict=True)):
            rpm, tpm, max_streams = limit_args(scope.limits)
            if rpm or tpm:
                # Wall clocks can step back; the log stays in time order regardless.
                ts = max(now_ms, log.entries[-1][0]) if log.entries else now_ms
                log.entries.append((ts, ask.request_id))
                log.tokens[ask.request_id] = ask.tokens
                log.total += ask.tokens
            if max_streams:
                log.leases[ask.request_id] = now_ms + self._lease_ms
            self._scopes[scope.id] = log
            states[i] = ScopeState(
                len(log.entries), log.total, len(log.leases), log.reset_ms(now_ms, window)
            )
        return Verdict(True, tuple(states))

    async def settle(self, ask: Ask, used_tokens: int, now_ms: int) -> None:
        for scope in ask.scopes:
            log = self._scopes.get(scope.id)
            if log is None:
                continue
            old = log.tokens.get(ask.request_id)
            if old is not None:
                log.tokens[ask.request_id] = used_tokens
                log.total += used_tokens - old
            log.leases.pop(ask.request_id, None)
        self._forget_empty(ask)

    async def renew(self, asks: Sequence[Ask], now_ms: int) -> None:
        for ask in asks:
            for scope in ask.scopes:
                log = self._scopes.get(scope.id)
                if log is not None and ask.request_id in log.leases:
                    log.leases[ask.request_id] = now_ms + self._lease_ms

    def sweep(self, now_ms: int) -> None:
        """Purge every scope and drop the empty ones (scopes that saw no traffic lately)."""
        for scope_id, log in list(self._scopes.items()):
            log.purge(now_ms, self._window_ms)
            if log.empty():
                del self._scopes[scope_id]

    def _forget_empty(self, ask: Ask) -> None:
        for scope in ask.scopes:
            log = self._scopes.get(scope.id)
            if log is not None and log.empty():
                del self._scopes[scope.id]
