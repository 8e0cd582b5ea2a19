"""Every plugin registered for services.router runs inside the simulator, unchanged.

The list comes from the router's own registry (``default_registry()``): a plugin added there
that the simulator cannot drive (it needs something a simulated replica does not provide)
fails here, not in a benchmark a month later.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from services.planet.scenario import build
from services.planet.sim import Planet
from services.router.scheduling.registry import default_registry

from .conftest import ROOT

REGISTRY = default_registry()
REQUIRED = [{"type": "model-ready"}, {"type": "residency"}, {"type": "capability"}]


def profile_with(kind: str, name: str) -> dict[str, Any]:
    filters = list(REQUIRED)
    scorers: list[dict[str, Any]] = [{"type": "latency", "weight": 1}]
    picker: dict[str, Any] = {"type": "max-score"}
    if kind == "filter" and name not in ("model-ready", "residency", "capability"):
        filters.append({"type": name})
    elif kind == "scorer":
        scorers = [{"type": name, "weight": 1}]
    elif kind == "picker":
        picker = {"type": name}
    return {
        "profiles": {f"with-{name}": {"filters": filters, "scorers": scorers, "picker": picker}}
    }


CASES = [(kind, name) for kind in ("filter", "scorer", "picker") for name in REGISTRY.names(kind)]


def test_the_cases_are_every_registered_plugin() -> None:
    assert len(CASES) == sum(len(REGISTRY.names(k)) for k in ("filter", "scorer", "picker")) >= 20


@pytest.mark.parametrize(("kind", "name"), CASES)
def test_every_registered_plugin_routes_simulated_traffic(
    tmp_path: Path, small: dict[str, Any], kind: str, name: str
) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(profile_with(kind, name)))
    small["duration_s"] = 3
    small["router"] = {"profile": str(profile)}
    small["events"] = [{"kind": "worker-crash", "region": "jp", "count": 1, "at_s": 1}]
    sc = build(small, source="s.yaml", base=ROOT)
    planet = Planet(sc)
    stats = planet.run()
    m = planet.metrics
    assert stats.decisions >= stats.requests > 20
    assert m.ttft[("all", "")].count > 0.8 * stats.requests  # it routed, and requests ran
    assert m.residency_violations == 0
