"""A small world for the planet simulator's tests: three regions, two edge sites, seconds."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]

SMALL: dict[str, Any] = {
    "name": "small",
    "seed": 3,
    "duration_s": 20,
    "world": {
        "regions": [
            {"code": "kr", "lat": 37.57, "lon": 126.98, "zone": "kr"},
            {"code": "jp", "lat": 35.68, "lon": 139.69, "zone": "jp"},
            {"code": "us", "lat": 39.04, "lon": -77.49, "zone": "us"},
        ],
        "sites": [
            {
                "name": "seoul",
                "lat": 37.57,
                "lon": 126.98,
                "utc_offset_h": 9,
                "population_m": 10,
                "zone": "kr",
            },
            {
                "name": "tokyo",
                "lat": 35.68,
                "lon": 139.69,
                "utc_offset_h": 9,
                "population_m": 30,
                "zone": "jp",
            },
        ],
    },
    "fleet": {
        "gpus": {"small": {"max_num_seqs": 8, "kv_cache_tokens": 32768}},
        "groups": [
            {"regions": ["kr", "jp"], "workers": 2, "gpu": "small", "models": ["m"]},
            {"regions": ["us"], "workers": 1, "gpu": "small", "models": ["m"]},
        ],
    },
    "traffic": {
        "rate_per_s": 20,
        "mixes": [
            {
                "name": "chat",
                "share": 1,
                "model": "m",
                "system_tokens": 256,
                "prompt_tokens": {"median": 300, "sigma": 0.8},
                "output_tokens": {"median": 60, "sigma": 0.8, "max": 400},
                "continue_p": 0.5,
            },
        ],
        "tenants": [
            {"name": "a", "share": 0.7, "tier": "standard"},
            {"name": "pinned", "share": 0.3, "tier": "high", "residency": "local"},
        ],
    },
}


@pytest.fixture
def small() -> dict[str, Any]:
    return copy.deepcopy(SMALL)
