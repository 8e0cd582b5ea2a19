"""Rebuild the edge's vendored browser assets from the pinned npm packages.

    make web-assets        # npm ci in services/edge/web (package-lock.json), then this script

The built files are committed (services/edge/web/static/vendor/, static/world.json), so a
clean clone builds, tests and runs without npm or the internet; this script is how they were
made and how to refresh them after a version bump in package.json/package-lock.json:

- ``vendor/purify.min.js`` — DOMPurify's browser build, as published;
- ``vendor/marked.umd.js`` — marked's UMD build, as published;
- ``world.json`` — the land of Natural Earth 1:110m (``world-atlas/land-110m.json``, TopoJSON)
  as one SVG path in an equirectangular projection (x = longitude, y = −latitude, degrees,
  0.1° precision, Antarctica cut off below 60° S), so the console places a region at
  (lon, −lat) with no projection code in the browser.

Each vendored file loses its ``sourceMappingURL`` comment (the maps are not shipped: a
browser with developer tools open would otherwise ask for them and log 404s).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

WEB = Path(__file__).resolve().parents[1] / "services/edge/web"
MODULES = WEB / "node_modules"
STATIC = WEB / "static"
VENDOR = {
    "dompurify/dist/purify.min.js": "purify.min.js",
    "marked/lib/marked.umd.js": "marked.umd.js",
}
LICENSES = {"dompurify": "dompurify/LICENSE", "marked": "marked/LICENSE"}
SOUTH_LIMIT = -60.0
NORTH_LIMIT = 85.0
_SOURCE_MAP = re.compile(rb"\n?//# sourceMappingURL=\S+\s*$")


def decode_arcs(topology: dict[str, Any]) -> list[list[tuple[float, float]]]:
    """TopoJSON arcs (quantized, delta-encoded) as lists of (lon, lat)."""
    (sx, sy), (tx, ty) = topology["transform"]["scale"], topology["transform"]["translate"]
    arcs = []
    for arc in topology["arcs"]:
        x = y = 0
        points = []
        for dx, dy in arc:
            x += dx
            y += dy
            points.append((x * sx + tx, y * sy + ty))
        arcs.append(points)
    return arcs


def ring(arcs: list[list[tuple[float, float]]], indexes: list[int]) -> list[tuple[float, float]]:
    """One ring from arc indexes (a negative index ``~i`` is arc ``i`` reversed); shared end
    points are kept once."""
    out: list[tuple[float, float]] = []
    for index in indexes:
        points = arcs[index] if index >= 0 else arcs[~index][::-1]
        out.extend(points[1:] if out else points)
    return out


def polygons(topology: dict[str, Any], name: str) -> list[list[list[tuple[float, float]]]]:
    arcs = decode_arcs(topology)
    out = []
    for geometry in topology["objects"][name]["geometries"]:
        kind, coords = geometry["type"], geometry.get("arcs", [])
        groups = [coords] if kind == "Polygon" else coords if kind == "MultiPolygon" else []
        for polygon in groups:
            out.append([ring(arcs, r) for r in polygon])
    return out


def unwrap(r: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A ring whose longitude jumps across the antimeridian (Russia's far east, Fiji) made
    continuous: past ±180° it continues outside the map rather than drawing a line across it."""
    out = [r[0]]
    for lon, lat in r[1:]:
        prev = out[-1][0]
        while lon - prev > 180:
            lon -= 360
        while lon - prev < -180:
            lon += 360
        out.append((lon, lat))
    return out


def svg_path(polys: list[list[list[tuple[float, float]]]]) -> str:
    parts = []
    for poly in polys:
        for raw in poly:
            if max(lat for _, lat in raw) < SOUTH_LIMIT:
                continue  # Antarctica: nobody routes there, and it takes a third of the map
            r = unwrap(raw)
            shifts = [0.0]
            if max(lon for lon, _ in r) > 180:
                shifts.append(-360.0)
            if min(lon for lon, _ in r) < -180:
                shifts.append(360.0)
            for shift in shifts:
                pts: list[str] = []
                last = ""
                for lon, lat in r:
                    p = f"{lon + shift:.1f} {-max(min(lat, NORTH_LIMIT), SOUTH_LIMIT - 5):.1f}"
                    if p != last:
                        pts.append(p)
                        last = p
                if len(pts) >= 3:
                    parts.append("M" + "L".join(pts) + "Z")
    return "".join(parts)


def world_json(topology: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": "world-atlas land-110m (Natural Earth, public domain)",
        "projection": "equirectangular: x = longitude, y = -latitude (degrees)",
        "viewBox": [-180, -NORTH_LIMIT, 360, NORTH_LIMIT - SOUTH_LIMIT],
        "land": svg_path(polygons(topology, "land")),
    }


def main() -> int:
    if not MODULES.is_dir():
        print(f"{MODULES} is missing: run `make web-assets` (npm ci first)", file=sys.stderr)
        return 2
    vendor = STATIC / "vendor"
    vendor.mkdir(parents=True, exist_ok=True)
    for src, dest in VENDOR.items():
        data = _SOURCE_MAP.sub(b"\n", (MODULES / src).read_bytes())
        (vendor / dest).write_bytes(data)
    notices = []
    for name, path in LICENSES.items():
        version = json.loads((MODULES / name / "package.json").read_text())["version"]
        notices.append(f"== {name} {version} ==\n{(MODULES / path).read_text().strip()}\n")
    (vendor / "LICENSES.txt").write_text("\n".join(notices))
    topology = json.loads((MODULES / "world-atlas/land-110m.json").read_text())
    (STATIC / "world.json").write_text(json.dumps(world_json(topology), separators=(",", ":")))
    print(f"wrote {vendor} and {STATIC / 'world.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
