"""Plugin registry: type name → plugin class, for the profile loader.

The built-in plugins are listed once, here (``BUILTIN_PLUGINS``); a registry is an ordinary
object built from such a list, so tests and embedders can add their own plugins to a copy
without touching global state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from services.router.scheduling.filters.admission import AdmissionFilter
from services.router.scheduling.filters.capability import CapabilityFilter
from services.router.scheduling.filters.draining import NotDrainingFilter
from services.router.scheduling.filters.ejection import FailureEjectionFilter
from services.router.scheduling.filters.exclude import ExcludeFilter
from services.router.scheduling.filters.healthy import HealthyFilter
from services.router.scheduling.filters.model import ModelReadyFilter
from services.router.scheduling.filters.reserve import TierReserveFilter
from services.router.scheduling.filters.residency import ResidencyFilter
from services.router.scheduling.filters.stale import FreshReportFilter
from services.router.scheduling.pickers.max_score import MaxScorePicker
from services.router.scheduling.pickers.power_of_two import PowerOfTwoPicker
from services.router.scheduling.pickers.round_robin import RoundRobinPicker
from services.router.scheduling.pickers.weighted_random import WeightedRandomPicker
from services.router.scheduling.plugin import Filter, Picker, Plugin, Scorer
from services.router.scheduling.scorers.gpu import GpuScorer
from services.router.scheduling.scorers.kv_cache import KvCacheScorer
from services.router.scheduling.scorers.latency import LatencyScorer
from services.router.scheduling.scorers.load import LoadScorer
from services.router.scheduling.scorers.loss import LossScorer
from services.router.scheduling.scorers.prefix_affinity import PrefixAffinityScorer
from services.router.scheduling.scorers.queue import QueueScorer
from services.router.scheduling.scorers.region import RegionProximityScorer
from services.router.scheduling.scorers.session_affinity import SessionAffinityScorer
from services.router.scheduling.scorers.throughput import ThroughputScorer

PluginKind = Literal["filter", "scorer", "picker"]

BUILTIN_PLUGINS: tuple[type[Plugin], ...] = (
    # filters
    ExcludeFilter,
    ResidencyFilter,
    ModelReadyFilter,
    CapabilityFilter,
    HealthyFilter,
    NotDrainingFilter,
    FreshReportFilter,
    FailureEjectionFilter,
    AdmissionFilter,
    TierReserveFilter,
    # scorers
    LatencyScorer,
    LossScorer,
    QueueScorer,
    KvCacheScorer,
    GpuScorer,
    ThroughputScorer,
    LoadScorer,
    PrefixAffinityScorer,
    SessionAffinityScorer,
    RegionProximityScorer,
    # pickers
    MaxScorePicker,
    WeightedRandomPicker,
    RoundRobinPicker,
    PowerOfTwoPicker,
)


def kind_of(cls: type[Plugin]) -> PluginKind:
    """Which extension point a plugin class implements."""
    if issubclass(cls, Filter):
        return "filter"
    if issubclass(cls, Scorer):
        return "scorer"
    if issubclass(cls, Picker):
        return "picker"
    raise TypeError(f"{cls.__name__} is not a filter, scorer or picker")


class PluginRegistry:
    """Type names → plugin classes; a name is unique across all extension points."""

    __slots__ = ("_by_type",)

    def __init__(self, plugins: Iterable[type[Plugin]] = ()) -> None:
        self._by_type: dict[str, type[Plugin]] = {}
        for cls in plugins:
            self.register(cls)

    def register(self, cls: type[Plugin]) -> None:
        kind_of(cls)  # raises for anything else
        name = getattr(cls, "TYPE", "")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{cls.__name__} has no TYPE name")
        if name in self._by_type:
            raise ValueError(f"plugin type '{name}' is registered twice")
        self._by_type[name] = cls

    def lookup(self, type_name: str) -> type[Plugin] | None:
        return self._by_type.get(type_name)

    def names(self, kind: PluginKind) -> tuple[str, ...]:
        return tuple(sorted(n for n, c in self._by_type.items() if kind_of(c) == kind))


def default_registry() -> PluginRegistry:
    """A registry of every built-in plugin."""
    return PluginRegistry(BUILTIN_PLUGINS)
