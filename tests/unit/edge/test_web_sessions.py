"""Console sessions: origin checks, the login-failure window, cookie names, config."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from services.common.clock import ManualClock
from services.edge.web.config import Place, WebConfig, parse_place
from services.edge.web.sessions import LoginFailures, cookie_name, same_origin


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ({}, True),  # curl: no ambient cookie unless told
        ({"Sec-Fetch-Site": "same-origin"}, True),
        ({"Sec-Fetch-Site": "same-origin", "Origin": "null"}, True),  # no-referrer pages
        ({"Sec-Fetch-Site": "cross-site"}, False),
        ({"Sec-Fetch-Site": "same-site"}, False),
        ({"Origin": "http://edge.example:8080"}, True),
        ({"Origin": "http://evil.example"}, False),
        ({"Origin": "null"}, False),
    ],
)
def test_state_changing_console_requests_must_come_from_this_origin(
    headers: dict[str, str], ok: bool
) -> None:
    request = make_mocked_request(
        "POST", "/console/logout", headers={"Host": "edge.example:8080", **headers}
    )
    assert same_origin(request) is ok


def test_failed_logins_are_limited_per_address_within_a_minute() -> None:
    clock = ManualClock()
    failures = LoginFailures(per_minute=3, clock=clock)
    for _ in range(3):
        assert failures.retry_after_s("1.2.3.4") == 0
        failures.failed("1.2.3.4")
    assert failures.retry_after_s("1.2.3.4") == pytest.approx(60)
    assert failures.retry_after_s("5.6.7.8") == 0
    clock.advance(30)
    assert failures.retry_after_s("1.2.3.4") == pytest.approx(30)
    clock.advance(30.1)
    assert failures.retry_after_s("1.2.3.4") == 0


def test_the_failure_window_remembers_a_bounded_number_of_addresses() -> None:
    failures = LoginFailures(per_minute=1, clock=ManualClock(), max_ips=2)
    for ip in ("a", "b", "c"):
        failures.failed(ip)
    assert failures.retry_after_s("a") == 0  # forgotten, oldest first
    assert failures.retry_after_s("c") > 0


def test_the_cookie_is_host_bound_where_tls_allows() -> None:
    assert cookie_name(tls=True) == "__Host-meridian_console"
    assert cookie_name(tls=False) == "meridian_console"


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("kr", "NAME=LAT,LON"),
        ("kr=37.5", "NAME=LAT,LON"),
        ("kr=north,east", "numbers"),
        ("kr=91,0", "latitude"),
        ("kr=0,181", "longitude"),
        ("=1,2", "short name"),
        ("kr=nan,0", "latitude"),
    ],
)
def test_bad_map_places_are_refused_with_what_is_wrong(value: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_place(value)


def test_places_parse_and_names_are_unique() -> None:
    assert parse_place("us-west=45.6,-121.2") == Place("us-west", 45.6, -121.2)
    with pytest.raises(ValueError, match="each name once"):
        WebConfig(places=(Place("kr", 1, 1), Place("kr", 2, 2)))
    with pytest.raises(ValueError, match="max_console_streams"):
        WebConfig(max_console_streams=0)
