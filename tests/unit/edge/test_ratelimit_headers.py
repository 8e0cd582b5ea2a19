from __future__ import annotations

import pytest

from services.edge.ratelimit.headers import go_duration, rate_limit_headers, refusal_message
from services.edge.ratelimit.types import Ask, Reason, Scope, ScopeState, Verdict
from services.edge.tenancy.tenants import Limits


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (-5, "0ms"),
        (0, "0ms"),
        (17, "17ms"),
        (999, "999ms"),
        (1000, "1s"),
        (8640, "8.64s"),
        (59_999, "59.999s"),
        (60_000, "1m0s"),
        (360_000, "6m0s"),
        (61_500, "1m1.5s"),
    ],
)
def test_durations_are_printed_as_openai_prints_them(ms: int, text: str) -> None:
    assert go_duration(ms) == text


KEY = Scope("key", "k1", "{t}:k:k1", Limits(rpm=10, tpm=1000))
TENANT = Scope("tenant", "t", "{t}:t", Limits(rpm=100, tpm=1200))


def test_headers_describe_the_scope_with_the_least_room_per_dimension() -> None:
    verdict = Verdict(True, (ScopeState(9, 100, 0, 5_000), ScopeState(50, 1100, 0, 1_000)))
    headers = rate_limit_headers(Ask("r", 10, (KEY, TENANT)), verdict)
    assert headers == {
        "x-ratelimit-limit-requests": "10",  # the key: 1 left, vs 50 for the tenant
        "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": "5s",
        "x-ratelimit-limit-tokens": "1200",  # the tenant: 100 left, vs 900 for the key
        "x-ratelimit-remaining-tokens": "100",
        "x-ratelimit-reset-tokens": "1s",
    }


def test_dimensions_nobody_limits_get_no_headers() -> None:
    only_streams = Scope("key", "k1", "{t}:k:k1", Limits(max_streams=3))
    verdict = Verdict(True, (ScopeState(0, 0, 1, 0),))
    assert rate_limit_headers(Ask("r", 10, (only_streams,)), verdict) == {}


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (Reason.REQUESTS, "requests per minute (RPM) on tenant t: Limit 100, Used 100"),
        (Reason.TOKENS, "tokens per minute (TPM) on tenant t: Limit 1200, Used 1190, Requested 20"),
        (Reason.STREAMS, "Too many concurrent requests on tenant t"),
        (Reason.TOO_LARGE, "Request too large for tokens per minute (TPM) on tenant t"),
    ],
)
def test_refusals_say_what_where_and_how_much(reason: Reason, expected: str) -> None:
    verdict = Verdict(
        False, (ScopeState(1, 0, 0, 0), ScopeState(100, 1190, 4, 2_000)), reason, 1, 2_000
    )
    message = refusal_message(Ask("r", 20, (KEY, TENANT)), verdict)
    assert expected in message
    if reason is not Reason.TOO_LARGE:
        assert message.endswith("Please try again in 2s.")


@pytest.mark.parametrize("reason", list(Reason))
def test_only_a_request_larger_than_the_tpm_is_marked_not_to_be_retried(reason: Reason) -> None:
    verdict = Verdict(
        False, (ScopeState(1, 0, 0, 0), ScopeState(100, 1190, 4, 2_000)), reason, 1, 2_000
    )
    headers = rate_limit_headers(Ask("r", 20, (KEY, TENANT)), verdict)
    # OpenAI's SDKs read x-should-retry before their "retry every 429" rule.
    assert headers.get("x-should-retry") == ("false" if reason is Reason.TOO_LARGE else None)
    admitted = Verdict(True, (ScopeState(1, 0, 0, 0), ScopeState(1, 0, 0, 0)))
    assert "x-should-retry" not in rate_limit_headers(Ask("r", 20, (KEY, TENANT)), admitted)
