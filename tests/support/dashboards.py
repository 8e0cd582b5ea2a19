"""Which metric names the provisioned Grafana dashboard queries (PromQL), for drift tests."""

from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[2] / (
    "deploy/observability/grafana/dashboards/meridian.json"
)
_NAME = re.compile(r"\b((?:meridian|gen_ai)_[a-zA-Z0-9_]+)")
# Label lists and selectors name labels, not metrics: "by (le, meridian_region)", "{job=...}".
_LABELS = re.compile(r"\b(?:by|without)\s*\([^)]*\)|\{[^}]*\}")
_SUFFIXES = ("_bucket", "_count", "_sum")


def dashboard_metric_names(path: Path = DASHBOARD) -> set[str]:
    """Metric families the dashboard's queries use (histogram suffixes stripped)."""
    dash = json.loads(path.read_text())
    names = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            for name in _NAME.findall(_LABELS.sub(" ", target["expr"])):
                for suffix in _SUFFIXES:
                    if name.endswith(suffix):
                        name = name[: -len(suffix)]
                names.add(name)
    return names
