"""The world as data: cloud regions, edge sites, and the measurements the network model is
calibrated against. Tables live in ``deploy/sim/*.csv`` (each with its source in its header)
and are read once; nothing here knows about time or traffic.

- ``regions.csv``: ``provider,code,city,lat,lon,zone`` — public cloud regions and the residency
  zone (jurisdiction) each belongs to;
- ``sites.csv``: ``name,lat,lon,utc_offset_h,population_m,zone`` — edge sites at population
  centres, the local time their users live by, and how many of them there are;
- ``calibration.csv``: ``a,b,rtt_ms`` — published inter-region round-trip times.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.common.cli import UnreadableFile, read_text
from services.planet.errors import ScenarioError
from services.planet.geo import Residual, RttModel, fit, great_circle_km


@dataclass(frozen=True, slots=True)
class Region:
    code: str
    provider: str
    city: str
    lat: float
    lon: float
    zone: str


@dataclass(frozen=True, slots=True)
class Site:
    name: str
    lat: float
    lon: float
    utc_offset_h: float
    population_m: float
    zone: str


RESERVED_ZONES = ("local", "any")
"""Words a tenant's ``residency`` gives a meaning of their own: no zone may be called so."""


def name_problem(value: str, *, zone: bool = False) -> str | None:
    """Why ``value`` cannot name a region, site or zone (None if it can): one word of at most
    64 printable characters. They key the router's views, the report's tables and tenants'
    residency lists, where a blank, a space, a '|' or a control character would be a silent
    mismatch or a broken table."""
    if not value:
        return "must not be empty"
    if len(value) > 64 or not value.isprintable() or any(c.isspace() or c == "|" for c in value):
        return f"must be one word of at most 64 printable characters, got {value!r}"
    if zone and value in RESERVED_ZONES:
        return f"{value!r} is reserved (a tenant's residency uses it), choose another zone name"
    return None


def _word(path: Path, line: int, row: dict[str, str], key: str, *, zone: bool = False) -> str:
    value = row[key].strip()
    problem = name_problem(value, zone=zone)
    if problem is not None:
        raise ScenarioError(str(path), [f"line {line}: {key} {problem}"])
    return value


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """Data rows of a CSV table whose comment lines start with '#', with line numbers."""
    try:
        text = read_text(path)
    except UnreadableFile as err:  # missing, a directory, not UTF-8, ...
        raise ScenarioError(str(path), [f"cannot read: {err.reason}"]) from None
    text = text.removeprefix("\ufeff")  # the byte-order mark spreadsheets write
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines())]
    data = [(n, line) for n, line in lines if line.strip() and not line.startswith("#")]
    if not data:
        raise ScenarioError(str(path), ["empty table"])
    if len(data) == 1:
        raise ScenarioError(str(path), [f"line {data[0][0]}: a header and no rows"])
    header_line, header = data[0]
    names = tuple(next(csv.reader([header])))
    if names != columns:
        raise ScenarioError(
            str(path), [f"line {header_line}: columns must be {','.join(columns)}, got {header}"]
        )
    for n, line in data[1:]:
        values = next(csv.reader([line]))
        if len(values) != len(columns):
            raise ScenarioError(str(path), [f"line {n}: expected {len(columns)} fields"])
        yield n, dict(zip(columns, values, strict=True))


def _number(path: Path, line: int, row: dict[str, str], key: str, lo: float, hi: float) -> float:
    try:
        value = float(row[key])
    except ValueError:
        raise ScenarioError(str(path), [f"line {line}: {key} must be a number"]) from None
    if not (math.isfinite(value) and lo <= value <= hi):
        raise ScenarioError(str(path), [f"line {line}: {key} must be within [{lo}, {hi}]"])
    return value


def read_regions(path: Path) -> dict[str, Region]:
    out: dict[str, Region] = {}
    for n, row in _rows(path, ("provider", "code", "city", "lat", "lon", "zone")):
        code = _word(path, n, row, "code")
        if code in out:
            raise ScenarioError(str(path), [f"line {n}: region {code!r} listed twice"])
        out[code] = Region(
            code=code,
            provider=row["provider"].strip(),
            city=row["city"].strip(),
            lat=_number(path, n, row, "lat", -90, 90),
            lon=_number(path, n, row, "lon", -180, 180),
            zone=_word(path, n, row, "zone", zone=True),
        )
    return out


def read_sites(path: Path) -> dict[str, Site]:
    out: dict[str, Site] = {}
    columns = ("name", "lat", "lon", "utc_offset_h", "population_m", "zone")
    for n, row in _rows(path, columns):
        name = _word(path, n, row, "name")
        if name in out:
            raise ScenarioError(str(path), [f"line {n}: site {name!r} listed twice"])
        out[name] = Site(
            name=name,
            lat=_number(path, n, row, "lat", -90, 90),
            lon=_number(path, n, row, "lon", -180, 180),
            utc_offset_h=_number(path, n, row, "utc_offset_h", -12, 14),
            population_m=_number(path, n, row, "population_m", 0, 1000),
            zone=_word(path, n, row, "zone", zone=True),
        )
    return out


def read_calibration(path: Path, regions: dict[str, Region]) -> list[tuple[str, str, float]]:
    out = []
    for n, row in _rows(path, ("a", "b", "rtt_ms")):
        a, b = row["a"].strip(), row["b"].strip()
        for code in (a, b):
            if code not in regions:
                raise ScenarioError(str(path), [f"line {n}: unknown region {code!r}"])
        out.append((a, b, _number(path, n, row, "rtt_ms", 0.01, 10_000)))
    return out


def calibrate(
    regions: dict[str, Region], measured: list[tuple[str, str, float]]
) -> tuple[RttModel, list[Residual]]:
    """The RTT model fitted to the measurements, and each measurement's residual."""
    pairs = []
    for a, b, rtt in measured:
        ra, rb = regions[a], regions[b]
        pairs.append((a, b, great_circle_km(ra.lat, ra.lon, rb.lat, rb.lon), rtt))
    model = fit((d, rtt) for _, _, d, rtt in pairs)
    residuals = [Residual(a, b, d, rtt, model.rtt_ms(d)) for a, b, d, rtt in pairs]
    return model, residuals
