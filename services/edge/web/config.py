"""The web pages' configuration: where things are on the map, and the console's limits."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, slots=True)
class Place:
    """A named point on the console's map: the edge site, or a region."""

    name: str
    lat: float
    lon: float

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"place {self.name!r}: a short name of letters, digits, . _ -")
        if not (math.isfinite(self.lat) and -90 <= self.lat <= 90):
            raise ValueError(f"place {self.name!r}: latitude must be -90..90")
        if not (math.isfinite(self.lon) and -180 <= self.lon <= 180):
            raise ValueError(f"place {self.name!r}: longitude must be -180..180")


def parse_place(value: str) -> Place:
    """``NAME=LAT,LON`` (``kr=37.5,127.0``); ValueError says what is wrong."""
    name, sep, coords = value.partition("=")
    lat_s, comma, lon_s = coords.partition(",")
    if not sep or not comma:
        raise ValueError(f"{value!r}: expected NAME=LAT,LON, e.g. kr=37.5,127.0")
    try:
        lat, lon = float(lat_s), float(lon_s)
    except ValueError:
        raise ValueError(f"{value!r}: latitude and longitude must be numbers") from None
    return Place(name.strip(), lat, lon)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebConfig:
    #: Where the edge site and each region are drawn (regions without a place are listed
    #: beside the map). Names match the edge's ``--site`` and the workers' regions.
    places: tuple[Place, ...] = ()
    #: Console sessions end this long after login (the cookie's Max-Age and the Redis TTL).
    session_ttl_s: float = 8 * 3600.0
    #: Live console event streams: in all, and per session.
    max_console_streams: int = 16
    max_console_streams_per_session: int = 4
    #: Per stream: decisions and events waiting to be written; beyond that the oldest are
    #: dropped (and counted) — a slow browser never makes the edge buffer without bound.
    max_pending_decisions: int = 512
    max_pending_events: int = 128
    #: A comment line on an idle stream, so proxies keep it open; the session is re-checked.
    heartbeat_s: float = 15.0
    #: Failed console logins per client IP per minute.
    login_failures_per_minute: int = 10

    def __post_init__(self) -> None:
        names = [p.name for p in self.places]
        if len(set(names)) != len(names):
            raise ValueError("places: each name once")
        if self.session_ttl_s < 60:
            raise ValueError("session_ttl_s must be >= 60")
        for name in (
            "max_console_streams",
            "max_console_streams_per_session",
            "max_pending_decisions",
            "max_pending_events",
            "login_failures_per_minute",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not self.heartbeat_s > 0:
            raise ValueError("heartbeat_s must be > 0")

    def place(self, name: str) -> Place | None:
        for p in self.places:
            if p.name == name:
                return p
        return None
