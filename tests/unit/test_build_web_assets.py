"""The world map's build: TopoJSON arcs decoded, rings across the antimeridian kept whole,
and the committed map in the shape the console reads."""

from __future__ import annotations

import json
from typing import Any

from services.edge.web.assets import STATIC_DIR
from tools.build_web_assets import decode_arcs, polygons, ring, svg_path, unwrap

TOPOLOGY: dict[str, Any] = {
    "type": "Topology",
    "transform": {"scale": [1, 1], "translate": [0, 0]},
    "arcs": [[[0, 0], [10, 0], [0, 10]], [[10, 10], [-10, 0], [0, -10]]],
    "objects": {
        "land": {
            "type": "GeometryCollection",
            "geometries": [{"type": "Polygon", "arcs": [[0, 1]]}],
        }
    },
}


def test_arcs_are_delta_decoded_and_joined_into_rings() -> None:
    arcs = decode_arcs(TOPOLOGY)
    assert arcs[0] == [(0, 0), (10, 0), (10, 10)]
    assert ring(arcs, [0, 1]) == [(0, 0), (10, 0), (10, 10), (0, 10), (0, 0)]
    assert ring(arcs, [~0]) == [(10, 10), (10, 0), (0, 0)]  # a negative index runs backwards
    assert polygons(TOPOLOGY, "land") == [[ring(arcs, [0, 1])]]


def test_a_ring_across_the_antimeridian_continues_past_the_edge_and_is_drawn_twice() -> None:
    r = [(179.0, 60.0), (-179.0, 60.0), (-179.0, 62.0), (179.0, 62.0)]
    assert unwrap(r) == [(179.0, 60.0), (181.0, 60.0), (181.0, 62.0), (179.0, 62.0)]
    path = svg_path([[r]])
    assert path.count("M") == 2  # once as it is, once 360° to the west
    assert "L-179.0 -60.0" in path
    assert "180.0 -60" not in path  # no line across the whole map


def test_antarctica_is_left_out() -> None:
    assert svg_path([[[(0.0, -70.0), (10.0, -75.0), (20.0, -70.0)]]]) == ""


def test_the_committed_map_is_what_the_console_reads() -> None:
    world = json.loads((STATIC_DIR / "world.json").read_text())
    assert world["viewBox"] == [-180, -85.0, 360, 145.0]
    assert world["land"].startswith("M")
    assert world["land"].count("M") > 100  # continents and islands
