"""Distance on the globe and the round-trip time a packet needs to cover it.

    d_km   = great-circle distance (haversine, mean Earth radius 6,371 km)
    rtt_ms = overhead_ms + 2 · d_km · path_stretch / FIBRE_KM_PER_MS

Light in silica fibre travels at c / 1.468 ≈ 204 km per ms, and real paths are longer than the
great circle (cables follow coasts and land at a few stations; routes detour through exchange
points): ``path_stretch`` (≥ 1) covers that, ``overhead_ms`` the switching, serialisation and
last hops at both ends. Both are *fitted* to published inter-region measurements
(``deploy/sim/calibration.csv``, see its header for the source) by :func:`fit`: weighted least
squares on relative error, so a 20 ms pair counts as much as a 300 ms one. The fit and its
residuals are reported by ``python -m bench.planet --calibration`` and pinned by
``tests/unit/planet/test_geo.py``.

Why a distance model rather than a measured matrix: a matrix covers the ~10 AWS regions that
were measured together; the planet has ~100 regions of three providers and edge sites that are
not cloud regions at all. The model is the same for every pair, and its error against the
measurements is known.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

EARTH_RADIUS_KM = 6371.0
FIBRE_KM_PER_MS = 299_792.458 / 1.468 / 1000.0  # ≈ 204.2 km per ms


def great_circle_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Haversine distance between two points given in degrees."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp = p2 - p1
    dl = math.radians(lon2 - lon1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


@dataclass(frozen=True, slots=True, kw_only=True)
class RttModel:
    """``rtt_ms(d) = overhead_ms + 2·d·path_stretch / FIBRE_KM_PER_MS``."""

    path_stretch: float
    overhead_ms: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.path_stretch) and self.path_stretch >= 1.0):
            raise ValueError("path_stretch must be >= 1 (no path is shorter than the great circle)")
        if not (math.isfinite(self.overhead_ms) and self.overhead_ms >= 0.0):
            raise ValueError("overhead_ms must be >= 0")

    def rtt_ms(self, distance_km: float) -> float:
        return self.overhead_ms + 2.0 * distance_km * self.path_stretch / FIBRE_KM_PER_MS


@dataclass(frozen=True, slots=True)
class Residual:
    a: str
    b: str
    distance_km: float
    measured_ms: float
    modelled_ms: float

    @property
    def relative_error(self) -> float:
        return (self.modelled_ms - self.measured_ms) / self.measured_ms


def fit(samples: Iterable[tuple[float, float]]) -> RttModel:
    """Least-squares ``(path_stretch, overhead_ms)`` for ``(distance_km, measured_rtt_ms)``
    samples, minimising Σ ((model − measured) / measured)²; clamped to the physical range."""
    sw = sx = sy = sxx = sxy = 0.0
    for d, rtt in samples:
        if rtt <= 0:
            raise ValueError("measured RTTs must be > 0")
        w = 1.0 / (rtt * rtt)
        x = 2.0 * d / FIBRE_KM_PER_MS
        sw += w
        sx += w * x
        sy += w * rtt
        sxx += w * x * x
        sxy += w * x * rtt
    det = sw * sxx - sx * sx
    if sw == 0 or det <= 0:
        raise ValueError("need at least two samples at different distances")
    stretch = (sw * sxy - sx * sy) / det
    overhead = (sy - stretch * sx) / sw
    if overhead < 0:  # through the origin instead
        return RttModel(path_stretch=max(1.0, sxy / sxx), overhead_ms=0.0)
    return RttModel(path_stretch=max(1.0, stretch), overhead_ms=overhead)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return math.nan
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
