"""The seam between the worker's gRPC server and whatever runs the model.

Three implementations: ``SimEngine`` (services/worker/sim/), a performance model of a GPU server
for GPU-less stacks and large simulations, ``VllmEngine`` (services/worker/vllm/engine.py),
vLLM's ``AsyncLLM``, and ``UpstreamEngine`` (services/worker/upstream/), an existing
OpenAI-compatible server reached over HTTP. The server only knows this interface; it never
imports vllm.

Contract every engine keeps:

- ``generate`` validates the request before yielding anything and raises
  :class:`~services.common.errors.InvalidRequest` (or ``ContextLengthExceeded``,
  ``ModelNotFound``) for a request that can never succeed;
- it yields one :class:`EngineOutput` per step with the text delta; the last output has
  ``finish_reason`` set and final usage and timings;
- cancelling the task that iterates ``generate`` aborts the request inside the engine at once
  (no tokens are generated for nobody), and so does closing the generator (callers iterate
  it inside ``contextlib.aclosing`` so that happens at once, not at garbage collection);
  ``abort(request_id)`` does the same explicitly;
- ``load()`` is cheap and synchronous: it is read for every load report.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from opentelemetry.trace import Tracer


class EngineConfigError(ValueError):
    """A bad engine option, found before the engine is built; the message names the option."""


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class ModelState(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ChatTurn:
    role: str
    content: str
    name: str = ""


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """OpenAI sampling parameters, already range-checked by the edge and the worker server."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    model: str
    messages: tuple[ChatTurn, ...]
    sampling: SamplingOptions = SamplingOptions()
    priority: int = 0
    #: W3C ``traceparent`` of the worker's ``worker.Generate`` span ("" when not traced), for
    #: engines whose own spans and outgoing calls join the request's trace.
    traceparent: str = ""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(slots=True)
class EngineOutput:
    """One step of one request. Usage counts are cumulative; timings are in milliseconds."""

    text: str
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    queue_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuStat:
    index: int
    utilization: float
    memory_used_fraction: float


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: int
    waiting: int
    max_running: int
    kv_cache_usage: float
    tokens_per_second: float
    prefix_cache_hit_rate: float = 0.0
    gpus: tuple[GpuStat, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class ModelDescription:
    name: str
    state: ModelState
    max_model_len: int
    engine: str


@runtime_checkable
class Instrumented(Protocol):
    """An engine with telemetry of its own. Engines are built from flags before the worker's
    telemetry exists; ``WorkerServer`` hands over its tracer and meter before ``start()``."""

    def instrument(self, *, tracer: Tracer, meter: Meter) -> None: ...


class Engine(Protocol):
    """What the worker server needs from an engine. See the module docstring for the contract."""

    name: str

    async def start(self) -> None:
        """Load the model. ``models()`` reports LOADING until this returns."""
        ...

    async def shutdown(self) -> None:
        """Abort whatever is still running and release the engine."""
        ...

    def models(self) -> list[ModelDescription]: ...

    def load(self) -> EngineLoad: ...

    def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]: ...

    async def abort(self, request_id: str) -> None: ...
