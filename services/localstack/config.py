"""The local stack's shape, read from ``deploy/local/stack.yaml``.

Validated before anything starts; errors name their location (``regions.jp.rtt_ms: must be a
number >= 0``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")


class StackConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class RegionSpec:
    name: str
    rtt_ms: float
    workers: int
    jitter_ms: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StackConfig:
    site: str
    model: str
    regions: tuple[RegionSpec, ...]
    sim: dict[str, Any] = field(default_factory=dict)
    vllm_regions: dict[str, int] = field(default_factory=dict)
    vllm_options: dict[str, Any] = field(default_factory=dict)


def _num(data: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise StackConfigError(f"{where}.{key}: must be a number >= 0")
    return float(value)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise StackConfigError(f"{where}: must be a mapping")
    return value


def parse_stack_config(data: Any) -> StackConfig:
    root = _mapping(data, "stack")
    known = {"site", "model", "regions", "sim", "vllm"}
    for key in root:
        if key not in known:
            raise StackConfigError(f"{key}: unknown key (expected one of {sorted(known)})")
    site = root.get("site", "local")
    model = root.get("model", "meridian-sim")
    if not isinstance(site, str) or not _NAME_RE.match(site):
        raise StackConfigError("site: must be a short lowercase name")
    if not isinstance(model, str) or not model:
        raise StackConfigError("model: must be a non-empty string")
    regions_raw = _mapping(root.get("regions"), "regions")
    if not regions_raw:
        raise StackConfigError("regions: at least one region is required")
    regions = []
    for name, spec_raw in regions_raw.items():
        where = f"regions.{name}"
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise StackConfigError(f"{where}: region names are short lowercase names")
        spec = _mapping(spec_raw, where)
        for key in spec:
            if key not in {"rtt_ms", "workers", "jitter_ms"}:
                raise StackConfigError(f"{where}.{key}: unknown key")
        workers = spec.get("workers", 1)
        if isinstance(workers, bool) or not isinstance(workers, int) or not 0 <= workers <= 16:
            raise StackConfigError(f"{where}.workers: must be an integer 0..16")
        regions.append(
            RegionSpec(
                name=name,
                rtt_ms=_num(spec, "rtt_ms", where),
                workers=workers,
                jitter_ms=_num(spec, "jitter_ms", where, 0.0),
            )
        )
    vllm = _mapping(root.get("vllm"), "vllm")
    vllm_regions = _mapping(vllm.get("regions", {}), "vllm.regions")
    for name, count in vllm_regions.items():
        if name not in regions_raw:
            raise StackConfigError(f"vllm.regions.{name}: not one of the regions")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 4:
            raise StackConfigError(f"vllm.regions.{name}: must be an integer 0..4")
    return StackConfig(
        site=site,
        model=model,
        regions=tuple(regions),
        sim=_mapping(root.get("sim"), "sim"),
        vllm_regions=dict(vllm_regions),
        vllm_options=_mapping(vllm.get("options"), "vllm.options"),
    )


def load_stack_config(path: Path) -> StackConfig:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise StackConfigError(f"{path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise StackConfigError(f"{path}: invalid YAML: {err}") from None
    return parse_stack_config(data)
