"""The local stack tells the edge where its site and regions are on the console's map."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.edge.main import build_parser, config_from_args
from services.localstack.config import StackConfigError, load_stack_config, parse_stack_config

REPO = Path(__file__).resolve().parents[3]


def test_the_shipped_stack_places_its_site_and_every_region() -> None:
    config = load_stack_config(REPO / "deploy/local/stack.yaml")
    places = config.map_places()
    assert places[0].startswith("seoul=")
    assert {p.split("=")[0] for p in places[1:]} == {r.name for r in config.regions}
    # and the edge accepts them as they are passed
    argv = ["--redis-url", "redis://x:1/0", "--router", "127.0.0.1:1", "--plain-http"]
    for p in places:
        argv += ["--map-place", p]
    edge = config_from_args(build_parser().parse_args(argv))
    assert [p.name for p in edge.web.places] == [p.split("=")[0] for p in places]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"regions": {"kr": {"rtt_ms": 1, "location": [100, 0]}}}, r"regions\.kr\.location"),
        ({"regions": {"kr": {"rtt_ms": 1, "location": "Seoul"}}}, r"regions\.kr\.location"),
        ({"site_location": [1], "regions": {"kr": {"rtt_ms": 1}}}, "site_location"),
    ],
)
def test_a_bad_location_is_refused_where_it_is(data: dict[str, object], error: str) -> None:
    with pytest.raises(StackConfigError, match=error):
        parse_stack_config(data)


def test_a_region_without_a_location_is_not_placed() -> None:
    config = parse_stack_config({"regions": {"kr": {"rtt_ms": 1, "workers": 1}}})
    assert config.map_places() == []
