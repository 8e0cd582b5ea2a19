"""``capability``: the worker's model supports what the request needs.

Intent: a request is only sent where it can be served as asked — a tools request to a worker
whose engine parses tool calls, an embeddings request to a pooling model, a completions
request with ``echo`` to an engine that echoes, ``dimensions`` to a model that can truncate.
Sending it anywhere else would fail on the worker (or, worse, silently ignore the feature).
When the model is served but no worker in the allowed regions has the feature, the decision
is UNSUPPORTED and the edge answers 400 naming the field (not 503: retrying will not help).

Input: ``query.needs`` (``RequestNeeds``) and the model's ``capabilities`` in
``worker.models`` (``ModelCapabilities``, reported by the worker); the rule is
``services.common.capabilities.unmet``, shared with the edge's fallback ranking.
A worker that does not list the model passes (``model-ready`` names that).
Parameters: none. Memoised per (model, needs). Profiles must include this filter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.common.capabilities import Needs, unmet
from services.router.scheduling.params import Params
from services.router.scheduling.plugin import PluginContext, WorkerFilter
from services.router.scheduling.types import RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class CapabilityFilter(WorkerFilter[tuple[str, Needs]]):
    TYPE: ClassVar[str] = "capability"

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls()

    def key(self, query: RouteQuery) -> tuple[str, Needs]:
        return (query.model, query.needs)

    def reject(self, workers: Sequence[WorkerSnapshot], key: tuple[str, Needs]) -> list[str | None]:
        model, needs = key
        out: list[str | None] = []
        for w in workers:
            status = w.model(model)
            miss = None if status is None else unmet(status.capabilities, needs)
            # "<param>: …": the request field comes first, so the empty decision's error can
            # name it (services/router/service.py, unsupported_error).
            out.append(None if miss is None else f"{miss.param}: model '{model}' {miss.reason}")
        return out

    def readmits_in_s(self, rejected: Sequence[WorkerSnapshot]) -> float | None:
        return math.inf  # what the request needs: time alone does not change it
