"""OpenAI's rate-limit headers and 429 messages, from a :class:`~.types.Verdict`.

Headers (on every admitted response and on 429s), for the *binding* scope of each dimension
(the one with the least room left, key or tenant)::

    x-ratelimit-limit-requests      rpm
    x-ratelimit-remaining-requests  rpm - requests in the window
    x-ratelimit-reset-requests      until the oldest request leaves the window ("1s", "6m0s")
    x-ratelimit-limit-tokens / -remaining-tokens / -reset-tokens   the same for tpm

A dimension no scope limits gets no headers. "Reset" is when the next unit of room frees in a
sliding window — the moment a client waiting for room should retry.

A request larger than a whole tpm can never be admitted, so its 429 also says
``x-should-retry: false``: the header OpenAI's own SDKs obey before their status-code rule
(which retries every 429, twice by default, with backoff, for nothing).
"""

from __future__ import annotations

from services.edge.ratelimit.types import Ask, Reason, Verdict


def go_duration(ms: int) -> str:
    """Milliseconds as OpenAI (Go) prints durations: ``20ms``, ``1s``, ``8.64s``, ``6m0s``."""
    ms = max(0, ms)
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


NO_RETRY = {"x-should-retry": "false"}


def rate_limit_headers(ask: Ask, verdict: Verdict) -> dict[str, str]:
    headers: dict[str, str] = dict(NO_RETRY) if verdict.reason is Reason.TOO_LARGE else {}
    req = [
        (s.limits.rpm, st.requests, st.reset_ms)
        for s, st in zip(ask.scopes, verdict.states, strict=True)
        if s.limits.rpm
    ]
    if req:
        limit, used, reset = min(req, key=lambda r: r[0] - r[1])
        headers["x-ratelimit-limit-requests"] = str(limit)
        headers["x-ratelimit-remaining-requests"] = str(max(0, limit - used))
        headers["x-ratelimit-reset-requests"] = go_duration(reset)
    tok = [
        (s.limits.tpm, st.tokens, st.reset_ms)
        for s, st in zip(ask.scopes, verdict.states, strict=True)
        if s.limits.tpm
    ]
    if tok:
        limit, used, reset = min(tok, key=lambda r: r[0] - r[1])
        headers["x-ratelimit-limit-tokens"] = str(limit)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, limit - used))
        headers["x-ratelimit-reset-tokens"] = go_duration(reset)
    return headers


def refusal_message(ask: Ask, verdict: Verdict) -> str:
    """What went over, where, by how much, and when to retry — as OpenAI words it."""
    assert verdict.reason is not None and verdict.scope_index >= 0
    scope = ask.scopes[verdict.scope_index]
    state = verdict.states[verdict.scope_index]
    where = f"on {scope.kind} {scope.name}"
    retry = f" Please try again in {go_duration(verdict.retry_after_ms)}."
    if verdict.reason is Reason.REQUESTS:
        return (
            f"Rate limit reached for requests per minute (RPM) {where}: "
            f"Limit {scope.limits.rpm}, Used {state.requests}, Requested 1.{retry}"
        )
    if verdict.reason is Reason.TOKENS:
        return (
            f"Rate limit reached for tokens per minute (TPM) {where}: Limit {scope.limits.tpm}, "
            f"Used {state.tokens}, Requested {ask.tokens}.{retry}"
        )
    if verdict.reason is Reason.STREAMS:
        return (
            f"Too many concurrent requests {where}: Limit {scope.limits.max_streams}, "
            f"In use {state.streams}.{retry}"
        )
    return (
        f"Request too large for tokens per minute (TPM) {where}: Limit {scope.limits.tpm}, "
        f"Requested {ask.tokens} (prompt estimate + max_tokens, or without max_tokens the "
        "larger of min_tokens and the default completion budget). Lower max_tokens or "
        "min_tokens, or shorten the prompt."
    )
