"""Scheduling profiles as data: YAML → validated → :class:`SchedulerProfile`.

    profiles:
      default:
        filters:                      # hard constraints, in order
          - type: exclude
          - type: admission
            params: {thresholds: {low: 0.95, standard: 0.98, high: 1.0}}
        scorers:                      # weighted signals; every scorer needs a weight > 0
          - {type: latency, weight: 3, params: {tau_ms: 50}}
        picker: {type: max-score, params: {max_candidates: 3}}
        unavailable_retry_after_s: 1.0   # optional retry hint for UNAVAILABLE decisions
        regions: {max_regions: 3}        # optional region pre-selection (regional.py)

The whole document is validated before anything is built, and every problem is reported at
once with its location (GIE's ``config/loader/validation.go``)::

    profiles[default].scorers[2]: unknown plugin 'gpus' (known scorers: gpu, kv-cache, ...)
    profiles[default].scorers[0].weight: must be > 0
    profiles[default].filters[7].params.thresholds.low: must be > 0

Unknown keys and unknown parameter names are errors (a typo must not silently fall back to a
default). Every profile must include the ``model-ready`` and ``residency`` filters: serving a
model that is not loaded, or outside the regions a request may use, is never a scoring matter.
"""

from __future__ import annotations

import math
import os
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from services.common import yamlfile
from services.common.cli import UnreadableFile, read_text
from services.common.clock import SYSTEM_CLOCK, Clock
from services.router.scheduling.framework import SchedulerProfile, WeightedScorer
from services.router.scheduling.params import ParamError, Params
from services.router.scheduling.plugin import (
    Filter,
    Picker,
    Plugin,
    PluginContext,
    Scorer,
    WorkerFilter,
)
from services.router.scheduling.regional import RegionStage, read_stage
from services.router.scheduling.registry import (
    PluginKind,
    PluginRegistry,
    default_registry,
    kind_of,
)

REQUIRED_FILTERS = ("model-ready", "residency", "capability")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PROFILE_KEYS = ("filters", "scorers", "picker", "unavailable_retry_after_s", "regions")
_PLUGIN_KEYS: dict[PluginKind, tuple[str, ...]] = {
    "filter": ("type", "params"),
    "scorer": ("type", "weight", "params"),
    "picker": ("type", "params"),
}


class ProfileError(ValueError):
    """A profile document that cannot be used; ``problems`` lists each one with its location."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        if len(self.problems) == 1:
            message = f"{source}: {self.problems[0]}"
        else:
            lines = "\n  ".join(self.problems)
            message = f"{source}: {len(self.problems)} problems:\n  {lines}"
        super().__init__(message)


def load_profiles(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    clock: Clock = SYSTEM_CLOCK,
    rng: random.Random | None = None,
    registry: PluginRegistry | None = None,
) -> dict[str, SchedulerProfile]:
    """Every profile of a document (a YAML file path, or the parsed mapping), validated."""
    label, document = _read(source)
    builder = _Builder(registry or default_registry(), PluginContext(clock=clock), rng)
    schedulers = builder.document(document)
    if builder.problems:
        raise ProfileError(label, builder.problems)
    return schedulers


def load_profile(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    name: str | None = None,
    clock: Clock = SYSTEM_CLOCK,
    rng: random.Random | None = None,
    registry: PluginRegistry | None = None,
) -> SchedulerProfile:
    """One profile: ``name``, or the only one, or the one called ``default``.

    The whole document is validated either way, so a broken sibling profile fails fast too.
    """
    schedulers = load_profiles(source, clock=clock, rng=rng, registry=registry)
    label = _label(source)
    if name is not None:
        if name not in schedulers:
            raise ProfileError(label, [f"profiles: no profile named '{name}'"])
        return schedulers[name]
    if len(schedulers) == 1:
        return next(iter(schedulers.values()))
    if "default" in schedulers:
        return schedulers["default"]
    names = ", ".join(schedulers)
    raise ProfileError(label, [f"profiles: several profiles ({names}) and none named 'default'"])


def _label(source: str | os.PathLike[str] | Mapping[str, Any]) -> str:
    return "<mapping>" if isinstance(source, Mapping) else os.fspath(source)


def _read(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[str, object]:
    label = _label(source)
    if isinstance(source, Mapping):
        return label, source
    try:
        text = read_text(source)
    except UnreadableFile as err:  # missing, a directory, not UTF-8, ...
        raise ProfileError(label, [f"cannot read: {err.reason}"]) from None
    try:
        return label, yamlfile.safe_load(text)
    except yaml.YAMLError as err:
        raise ProfileError(label, [f"invalid YAML: {err}"]) from None


class _Builder:
    """Walks the document, collecting every problem with its location."""

    def __init__(
        self, registry: PluginRegistry, ctx: PluginContext, rng: random.Random | None
    ) -> None:
        self.registry = registry
        self.ctx = ctx
        self.rng = rng
        self.problems: list[str] = []

    def problem(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    def unknown_keys(self, where: str, value: Mapping[Any, Any], known: Sequence[str]) -> None:
        for key in value:
            if key not in known:
                self.problem(where, f"unknown key {key!r} (expected: {', '.join(known)})")

    def document(self, doc: object) -> dict[str, SchedulerProfile]:
        if not isinstance(doc, Mapping):
            self.problem("(document)", "must be a mapping with a 'profiles' key")
            return {}
        self.unknown_keys("(document)", doc, ("profiles",))
        profiles = doc.get("profiles")
        if not isinstance(profiles, Mapping) or not profiles:
            self.problem("profiles", "must be a non-empty mapping of profile name → profile")
            return {}
        out: dict[str, SchedulerProfile] = {}
        for name, body in profiles.items():
            if not isinstance(name, str) or not _NAME.match(name):
                self.problem(f"profiles[{name}]", "name must be letters, digits, '_', '.', '-'")
                continue
            scheduler = self.profile(name, body)
            if scheduler is not None:
                out[name] = scheduler
        return out

    def profile(self, name: str, body: object) -> SchedulerProfile | None:
        where = f"profiles[{name}]"
        if not isinstance(body, Mapping):
            self.problem(where, "must be a mapping")
            return None
        before = len(self.problems)
        self.unknown_keys(where, body, _PROFILE_KEYS)
        seen: set[str] = set()
        filters = [
            f
            for i, raw in enumerate(self.plugin_list(where, body, "filters", required=True))
            if isinstance(f := self.plugin(f"{where}.filters[{i}]", raw, "filter", seen), Filter)
        ]
        self.memoised_first(where, body, filters)
        present = {f.TYPE for f in filters}
        for required in REQUIRED_FILTERS:
            if required not in present and required not in seen:
                self.problem(
                    f"{where}.filters",
                    f"missing required filter '{required}' (a hard constraint, never optional)",
                )
        scorers: list[WeightedScorer] = []
        for i, raw in enumerate(self.plugin_list(where, body, "scorers", required=False)):
            loc = f"{where}.scorers[{i}]"
            scorer = self.plugin(loc, raw, "scorer", seen)
            weight = self.weight(loc, raw)
            if isinstance(scorer, Scorer) and weight is not None:
                scorers.append(WeightedScorer(scorer, weight))
        picker: Plugin | None = None
        if "picker" not in body:
            self.problem(f"{where}.picker", "required (e.g. {type: max-score})")
        else:
            picker = self.plugin(f"{where}.picker", body["picker"], "picker", seen)
        retry = body.get("unavailable_retry_after_s", 1.0)
        if (
            isinstance(retry, bool)
            or not isinstance(retry, int | float)
            or not (math.isfinite(retry) and retry >= 0)
        ):
            self.problem(f"{where}.unavailable_retry_after_s", "must be a number >= 0")
        stage: RegionStage | None = None
        if "regions" in body:
            try:
                stage = read_stage(body["regions"])
            except ParamError as err:
                path = f"{where}.regions" + (f".{err.path}" if err.path else "")
                self.problem(path, err.message)
        if len(self.problems) > before or not isinstance(picker, Picker):
            return None
        return SchedulerProfile(
            name=name,
            filters=filters,
            scorers=scorers,
            picker=picker,
            rng=self.rng,
            unavailable_retry_after_s=float(retry),
            regions=stage,
        )

    def memoised_first(self, where: str, body: Mapping[str, Any], filters: list[Filter]) -> None:
        """Memoised filters (``WorkerFilter``) always run before plain ones: the framework
        evaluates them in the memo, then the plain ones over the survivors. A profile that
        lists them the other way round would misstate the order rejections are named in, so
        it is refused where it says so."""
        raws = body.get("filters")  # not a list: plugin_list has said so already
        listed = (
            [r.get("type") for r in raws if isinstance(r, Mapping)]
            if isinstance(raws, list)
            else []
        )
        plain_at: str | None = None
        for f in filters:
            at = listed.index(f.TYPE) if f.TYPE in listed else -1
            if not isinstance(f, WorkerFilter):
                plain_at = plain_at or f"filters[{at}] ('{f.TYPE}')"
            elif plain_at is not None:
                self.problem(
                    f"{where}.filters[{at}]",
                    f"memoised filter '{f.TYPE}' must be listed before the plain filter at "
                    f"{plain_at}: memoised filters always run first",
                )

    def plugin_list(
        self, where: str, body: Mapping[str, Any], key: str, *, required: bool
    ) -> list[object]:
        value = body.get(key)
        if value is None:
            if required:
                self.problem(f"{where}.{key}", "required (a list of plugins)")
            return []
        if not isinstance(value, list):
            self.problem(f"{where}.{key}", "must be a list of plugins")
            return []
        return value

    def plugin(self, where: str, raw: object, kind: PluginKind, seen: set[str]) -> Plugin | None:
        if not isinstance(raw, Mapping):
            self.problem(where, "must be a mapping with a 'type'")
            return None
        known = _PLUGIN_KEYS[kind]
        for key in raw:
            if key not in known:
                hint = " (only scorers have a weight)" if key == "weight" else ""
                self.problem(where, f"unknown key {key!r} (expected: {', '.join(known)}){hint}")
        type_name = raw.get("type")
        if not isinstance(type_name, str) or not type_name:
            self.problem(f"{where}.type", "required (the plugin's type name)")
            return None
        cls = self.registry.lookup(type_name)
        if cls is None:
            choices = ", ".join(self.registry.names(kind))
            self.problem(where, f"unknown plugin '{type_name}' (known {kind}s: {choices})")
            return None
        actual = kind_of(cls)
        if actual != kind:
            self.problem(where, f"'{type_name}' is a {actual}, not a {kind}")
            return None
        if type_name in seen:
            self.problem(where, f"duplicate plugin '{type_name}' (each may appear once)")
            return None
        seen.add(type_name)
        try:
            params = Params(raw.get("params"))
            plugin = cls.from_params(params, self.ctx)
            params.finish()
        except ParamError as err:
            path = f"{where}.params.{err.path}" if err.path else f"{where}.params"
            self.problem(path, err.message)
            return None
        except ValueError as err:
            self.problem(where, str(err))
            return None
        return plugin

    def weight(self, where: str, raw: object) -> float | None:
        if not isinstance(raw, Mapping):
            return None
        if "weight" not in raw:
            self.problem(f"{where}.weight", "required (a scorer without a weight is an error)")
            return None
        value = raw["weight"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problem(f"{where}.weight", "must be a number")
            return None
        if not (math.isfinite(value) and value > 0):
            self.problem(f"{where}.weight", "must be > 0")
            return None
        return float(value)
