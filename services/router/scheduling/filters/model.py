"""``model-ready``: the worker lists the requested model and it is READY.

Intent: only a worker whose engine has the model loaded and accepting requests can serve it;
LOADING (weights still coming in), DRAINING (finishing its streams before shutdown) and FAILED
are not. Input: ``query.model``, ``worker.models``. Parameters: none. Memoised per model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from services.router.scheduling.params import Params
from services.router.scheduling.plugin import PluginContext, WorkerFilter
from services.router.scheduling.types import ModelState, RouteQuery, WorkerSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelReadyFilter(WorkerFilter[str]):
    TYPE: ClassVar[str] = "model-ready"

    @classmethod
    def from_params(cls, params: Params, ctx: PluginContext) -> Self:
        return cls()

    def key(self, query: RouteQuery) -> str:
        return query.model

    def reject(self, workers: Sequence[WorkerSnapshot], key: str) -> list[str | None]:
        # The common answer (the model is listed first and READY) without a call per worker;
        # anything else goes through _verdict, the rule as written.
        ready = ModelState.READY
        return [
            None
            if (ms := w.models) and ms[0].name == key and ms[0].state is ready
            else _verdict(w, key)
            for w in workers
        ]


def _verdict(w: WorkerSnapshot, model: str) -> str | None:
    status = w.model(model)
    if status is None:
        return f"does not serve model '{model}'"
    if status.state is ModelState.READY:
        return None
    return f"model '{model}' is {status.state.value}"
