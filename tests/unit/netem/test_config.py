"""Link profiles, routes and the ``--route`` syntax: valid input parses, bad input names itself."""

from __future__ import annotations

import math

import pytest

from services.common.errors import InvalidRequest
from services.netem.config import DEFAULT_RTO_MS, LinkProfile, Route, parse_route


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "kr:127.0.0.1:0=127.0.0.1:50051,delay_ms=40",
            Route(
                name="kr",
                listen_host="127.0.0.1",
                listen_port=0,
                upstream_host="127.0.0.1",
                upstream_port=50051,
                link=LinkProfile(delay_ms=40),
            ),
        ),
        (
            "us-east.1:0.0.0.0:7001=worker-us:50051,delay_ms=12.5,jitter_ms=2,loss=0.01,"
            "rto_ms=300,seed=9",
            Route(
                name="us-east.1",
                listen_host="0.0.0.0",
                listen_port=7001,
                upstream_host="worker-us",
                upstream_port=50051,
                link=LinkProfile(delay_ms=12.5, jitter_ms=2, loss=0.01, rto_ms=300, seed=9),
            ),
        ),
        (
            "v6:[::1]:0=[::1]:9000, delay_ms = 0 ",
            Route(
                name="v6",
                listen_host="::1",
                listen_port=0,
                upstream_host="::1",
                upstream_port=9000,
                link=LinkProfile(delay_ms=0),
            ),
        ),
    ],
)
def test_parse_route_accepts_the_documented_syntax(text: str, expected: Route) -> None:
    assert parse_route(text) == expected


@pytest.mark.parametrize(
    ("text", "param", "fragment"),
    [
        ("nothing", "route", "expected NAME:LISTEN_HOST"),
        ("k r:127.0.0.1:0=127.0.0.1:1,delay_ms=1", "route.name", "name must match"),
        ("kr:127.0.0.1:0,delay_ms=1", "route[kr].upstream", "missing '=UPSTREAM_HOST"),
        ("kr:127.0.0.1=127.0.0.1:1,delay_ms=1", "route[kr].listen", "expected HOST:PORT"),
        ("kr:127.0.0.1:0=127.0.0.1,delay_ms=1", "route[kr].upstream", "expected HOST:PORT"),
        ("kr:[::1:0=127.0.0.1:1,delay_ms=1", "route[kr].listen", "expected [HOST]:PORT"),
        ("kr:127.0.0.1:abc=127.0.0.1:1,delay_ms=1", "route[kr].listen_port", "not an integer"),
        ("kr:127.0.0.1:0=127.0.0.1:0,delay_ms=1", "route[kr].upstream_port", "[1, 65535]"),
        ("kr:127.0.0.1:70000=127.0.0.1:1,delay_ms=1", "route[kr].listen_port", "[0, 65535]"),
        ("kr:127.0.0.1:0=127.0.0.1:1", "route[kr].delay_ms", "missing"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=-5", "route[kr].delay_ms", "<= 60000, got -5.0"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=fast", "route[kr].delay_ms", "not a number"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=inf", "route[kr].delay_ms", "finite"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=1e12", "route[kr].delay_ms", "<= 60000"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=1,rto_ms=1e9", "route[kr].rto_ms", "<= 60000"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=1,jitter_ms=-1", "route[kr].jitter_ms", ">= 0"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=1,loss=1.5", "route[kr].loss", "[0, 1]"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=1,loss=nan", "route[kr].loss", "[0, 1]"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=1,seed=1.5", "route[kr].seed", "not an integer"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=1,bandwidth=9", "route[kr].bandwidth", "unknown"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=1,delay_ms=2", "route[kr].delay_ms", "twice"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms", "route[kr]", "expected KEY=VALUE"),
        ("kr:127.0.0.1:0=127.0.0.1:1,delay_ms=1,", "route[kr]", "expected KEY=VALUE"),
    ],
)
def test_parse_route_rejects_bad_input_naming_route_and_key(
    text: str, param: str, fragment: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_route(text)
    assert caught.value.param == param
    assert fragment in caught.value.message
    assert caught.value.message.startswith(param)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"delay_ms": -1.0}, "delay_ms"),
        ({"delay_ms": math.nan}, "delay_ms"),
        ({"jitter_ms": math.inf}, "jitter_ms"),
        ({"rto_ms": -0.1}, "rto_ms"),
        ({"loss": -0.01}, "loss"),
        ({"loss": 1.01}, "loss"),
        ({"seed": True}, "seed"),
    ],
)
def test_link_profile_rejects_impossible_links(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        LinkProfile(**fields)  # type: ignore[arg-type]
    assert caught.value.param == param


def test_link_profile_defaults_to_a_clean_link_with_a_linux_rto() -> None:
    link = LinkProfile()
    assert (link.delay_ms, link.jitter_ms, link.loss, link.seed) == (0, 0, 0, 0)
    assert link.rto_ms == DEFAULT_RTO_MS == 200


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"name": ""}, "name"),
        ({"name": "a/b"}, "name"),
        ({"listen_host": ""}, "listen_host"),
        ({"upstream_host": "a b"}, "upstream_host"),
        ({"listen_port": -1}, "listen_port"),
        ({"upstream_port": 0}, "upstream_port"),
        ({"upstream_port": 65536}, "upstream_port"),
    ],
)
def test_route_rejects_bad_fields(fields: dict[str, object], param: str) -> None:
    base: dict[str, object] = {"name": "kr", "upstream_host": "127.0.0.1", "upstream_port": 1}
    with pytest.raises(InvalidRequest) as caught:
        Route(**(base | fields))  # type: ignore[arg-type]
    assert caught.value.param == param
