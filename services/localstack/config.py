"""The local stack's shape, read from ``deploy/local/stack.yaml``.

Validated before anything starts; errors name their location (``regions.jp.rtt_ms: must be a
finite number >= 0, got nan``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from services.common import yamlfile
from services.common.cli import UnreadableFile, read_text
from services.worker.sim.config import SimConfig

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")

DEFAULT_VLLM_MODEL = "tiny-llama"
VLLM_OPTIONS: frozenset[str] = frozenset(
    {
        "dtype",
        "max_model_len",
        "max_num_seqs",
        "gpu_memory_utilization",
        "tensor_parallel_size",
        "enforce_eager",
        "no_prefix_caching",
        "scheduling_policy",
        "tool_call_parser",
        "enable_auto_tool_choice",
        "tool_strict_level",
        "tool_call_constraint",
        "structured_outputs_backend",
        "structured_outputs_compact",
        "quantization",
        "speculative_config",
        "max_choices",
    }
)
"""``vllm.options`` keys: the worker's vLLM flags (``max_model_len`` → ``--max-model-len``)."""


class StackConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class RegionSpec:
    name: str
    rtt_ms: float
    workers: int
    jitter_ms: float = 0.0
    #: (latitude, longitude) where the console's map draws the region; None: not drawn.
    location: tuple[float, float] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StackConfig:
    site: str
    model: str
    regions: tuple[RegionSpec, ...]
    sim: dict[str, Any] = field(default_factory=dict)
    vllm_model: str = DEFAULT_VLLM_MODEL
    vllm_regions: dict[str, int] = field(default_factory=dict)
    vllm_options: dict[str, Any] = field(default_factory=dict)
    # `vllm.embedding`: pooling (embedding) workers beside the chat ones (same options,
    # ``--runner pooling``), serving a tiny Matryoshka model; none when absent.
    vllm_embedding_model: str = ""
    vllm_embedding_regions: dict[str, int] = field(default_factory=dict)
    site_location: tuple[float, float] | None = None

    def map_places(self) -> list[str]:
        """The edge's ``--map-place`` values: the site and every region with a location."""
        out = []
        if self.site_location is not None:
            out.append(f"{self.site}={self.site_location[0]:g},{self.site_location[1]:g}")
        for r in self.regions:
            if r.location is not None:
                out.append(f"{r.name}={r.location[0]:g},{r.location[1]:g}")
        return out

    def served_model(self, engine: str) -> str:
        """The model name clients ask for when the stack runs ``engine`` workers."""
        return self.vllm_model if engine == "vllm" else self.model


def _is_number(value: object) -> TypeGuard[int | float]:
    """An int, or a finite float: YAML's ``.nan`` and ``.inf`` are floats, but never a
    distance, a delay or a coordinate."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _num(data: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = data.get(key, default)
    if _is_number(value) and value >= 0:
        return float(value)
    raise StackConfigError(f"{where}.{key}: must be a finite number >= 0, got {value!r}")


def _location(value: Any, where: str) -> tuple[float, float] | None:
    """``[lat, lon]`` in degrees, or absent."""
    if value is None:
        return None
    ok = isinstance(value, list) and len(value) == 2 and all(_is_number(v) for v in value)
    if not ok or not (-90 <= value[0] <= 90 and -180 <= value[1] <= 180):
        raise StackConfigError(f"{where}: must be [latitude, longitude] in degrees")
    return float(value[0]), float(value[1])


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise StackConfigError(f"{where}: must be a mapping")
    return value


def parse_stack_config(data: Any) -> StackConfig:
    root = _mapping(data, "stack")
    known = {"site", "site_location", "model", "regions", "sim", "vllm"}
    for key in root:
        if key not in known:
            raise StackConfigError(f"{key}: unknown key (expected one of {sorted(known)})")
    site = root.get("site", "local")
    model = root.get("model", "meridian-sim")
    if not isinstance(site, str) or not _NAME_RE.fullmatch(site):
        raise StackConfigError("site: must be a short lowercase name")
    if not isinstance(model, str) or not model:
        raise StackConfigError("model: must be a non-empty string")
    regions_raw = _mapping(root.get("regions"), "regions")
    if not regions_raw:
        raise StackConfigError("regions: at least one region is required")
    regions = []
    for name, spec_raw in regions_raw.items():
        where = f"regions.{name}"
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise StackConfigError(f"{where}: region names are short lowercase names")
        spec = _mapping(spec_raw, where)
        for key in spec:
            if key not in {"rtt_ms", "workers", "jitter_ms", "location"}:
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
                location=_location(spec.get("location"), f"{where}.location"),
            )
        )
    sim = _parse_sim(_mapping(root.get("sim"), "sim"), model)
    vllm_raw = dict(_mapping(root.get("vllm"), "vllm"))
    embedding_raw = _mapping(vllm_raw.pop("embedding", None), "vllm.embedding")
    vllm_model, vllm_regions, vllm_options = _parse_vllm(vllm_raw, regions_raw)
    embed_model, embed_regions = _parse_vllm_embedding(embedding_raw, regions_raw)
    return StackConfig(
        site=site,
        model=model,
        regions=tuple(regions),
        sim=sim,
        vllm_model=vllm_model,
        vllm_regions=vllm_regions,
        vllm_options=vllm_options,
        vllm_embedding_model=embed_model,
        vllm_embedding_regions=embed_regions,
        site_location=_location(root.get("site_location"), "site_location"),
    )


def _parse_sim(sim: dict[str, Any], model: str) -> dict[str, Any]:
    """``sim:``, the simulated workers' settings, checked here as each worker will check them
    (``--model`` sets ``models``), so a bad one stops ``make run`` before anything starts."""
    try:
        SimConfig.from_mapping({**sim, "models": [model]})
    except ValueError as err:
        raise StackConfigError(f"sim: {err}") from None
    return sim


def _parse_vllm(
    vllm: dict[str, Any], regions: dict[str, Any]
) -> tuple[str, dict[str, int], dict[str, Any]]:
    """The ``vllm:`` section: served model name, workers per region, worker flags."""
    for key in vllm:
        if key not in {"model", "regions", "options"}:
            raise StackConfigError(f"vllm.{key}: unknown key (expected model, regions, options)")
    model = vllm.get("model", DEFAULT_VLLM_MODEL)
    if not isinstance(model, str) or not model.strip():
        raise StackConfigError("vllm.model: must be a non-empty string")
    counts = _mapping(vllm.get("regions", {}), "vllm.regions")
    for name, count in counts.items():
        if name not in regions:
            raise StackConfigError(f"vllm.regions.{name}: not one of the regions")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 4:
            raise StackConfigError(f"vllm.regions.{name}: must be an integer 0..4")
    options = _mapping(vllm.get("options"), "vllm.options")
    for key, value in options.items():
        if key not in VLLM_OPTIONS:
            raise StackConfigError(
                f"vllm.options.{key}: unknown option (expected one of {sorted(VLLM_OPTIONS)})"
            )
        bad_float = isinstance(value, float) and not math.isfinite(value)
        if value is False or value is None or isinstance(value, dict | list) or bad_float:
            raise StackConfigError(
                f"vllm.options.{key}: must be a finite number, a string or true (a flag), "
                f"got {value!r}"
            )
    return model, dict(counts), dict(options)


def _parse_vllm_embedding(
    embedding: dict[str, Any], regions: dict[str, Any]
) -> tuple[str, dict[str, int]]:
    """``vllm.embedding``: the pooling model's served name and its workers per region."""
    if not embedding:
        return "", {}
    for key in embedding:
        if key not in {"model", "regions"}:
            raise StackConfigError(f"vllm.embedding.{key}: unknown key (expected model, regions)")
    model = embedding.get("model")
    if not isinstance(model, str) or not model.strip():
        raise StackConfigError("vllm.embedding.model: must be a non-empty string")
    counts = _mapping(embedding.get("regions", {}), "vllm.embedding.regions")
    for name, count in counts.items():
        if name not in regions:
            raise StackConfigError(f"vllm.embedding.regions.{name}: not one of the regions")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 4:
            raise StackConfigError(f"vllm.embedding.regions.{name}: must be an integer 0..4")
    return model, dict(counts)


def load_stack_config(path: Path) -> StackConfig:
    try:
        data = yamlfile.safe_load(read_text(path))
    except UnreadableFile as err:  # missing, a directory, not UTF-8, ...
        raise StackConfigError(str(err)) from None
    except yaml.YAMLError as err:
        raise StackConfigError(f"{path}: invalid YAML: {err}") from None
    return parse_stack_config(data)
