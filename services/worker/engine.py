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
- ``load()`` is cheap and synchronous: it is read for every load report;
- ``models()`` says, per model, what it supports (``capabilities``: chat, completions,
  embeddings, echo, ...): the router routes on it, so an engine never claims a feature it
  would refuse;
- a request with a ``prompt`` (POST /v1/completions) is run without a chat template; with
  ``echo`` the first output carries ``prompt_text`` (and, with logprobs, ``prompt_logprobs``);
- ``embed`` runs a batch of inputs through a pooling model and returns one unit vector each,
  or raises ``InvalidRequest`` naming the input (``input[3]``) or ``dimensions``.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from services.common.capabilities import CHAT_ONLY, Capabilities
from services.common.errors import InvalidRequest

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from opentelemetry.trace import Tracer
    from prometheus_client.registry import Collector


class EngineConfigError(ValueError):
    """A bad engine option, found before the engine is built; the message names the option."""


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    TOOL_CALLS = "tool_calls"


class ModelState(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the assistant made (in the history) or makes (in the output, assembled)."""

    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass(frozen=True, slots=True)
class ChatTurn:
    role: str
    content: str
    name: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""  # role "tool": the call this message answers


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call. ``parameters`` is its JSON schema (None = any object)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool = False


ToolChoiceMode = Literal["auto", "none", "required", "function"]


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode = "auto"
    function: str = ""  # mode "function": the one to call


ResponseFormatType = Literal["text", "json_object", "json_schema"]


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    type: ResponseFormatType = "text"
    schema: dict[str, Any] | None = None  # json_schema only
    name: str = ""
    strict: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One streamed piece of a tool call: the first piece of a call carries ``id`` and
    ``name``; later ones more ``arguments`` (OpenAI's ``delta.tool_calls[i]``)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


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
    # vLLM's extensions; None/empty = the engine's default.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class ResumeInput:
    """A stream continued from another worker (mid-stream migration): run the request as if
    it had already produced ``delivered_token_ids``, and stream only what follows.

    ``delivered_text_chars`` of those tokens' text reached the client (engines hold back a
    possible stop-string start, so the rest is sent first); ``delivered_text_tail`` is the
    end of that text, to match stop strings that straddle the boundary; randomness derived
    from a request id comes from ``origin_request_id``. Usage stays the original request's:
    prompt tokens are the prompt's, completion tokens include the delivered ones.
    """

    delivered_token_ids: tuple[int, ...]
    delivered_text_chars: int
    delivered_text_tail: str = ""
    origin_request_id: str = ""
    migrations: int = 1


@dataclass(frozen=True, slots=True)
class RawPrompt:
    """A prompt without a chat template: text, or token ids (exactly one is set)."""

    text: str | None = None
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    model: str
    messages: tuple[ChatTurn, ...]
    sampling: SamplingOptions = SamplingOptions()
    priority: int = 0
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    response_format: ResponseFormat = ResponseFormat()
    prompt: RawPrompt | None = None  # a completions request: used instead of ``messages``
    echo: bool = False  # completions: return the prompt with the first output
    resume: ResumeInput | None = None
    #: Drop the oldest turns until the prompt fits the context (Responses' truncation
    #: "auto"; services/worker/truncation.py) instead of refusing a prompt that does not.
    truncate_oldest: bool = False
    #: W3C ``traceparent`` of the worker's ``worker.Generate`` span ("" when not traced), for
    #: engines whose own spans and outgoing calls join the request's trace.
    traceparent: str = ""

    @property
    def seed_id(self) -> str:
        """The request id per-request randomness is derived from: the origin attempt's when
        this request continues a migrated stream."""
        if self.resume is not None and self.resume.origin_request_id:
            return self.resume.origin_request_id
        return self.request_id


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    request_id: str
    model: str
    inputs: tuple[RawPrompt, ...]
    dimensions: int = 0  # 0: the model's own size
    priority: int = 0


@dataclass(frozen=True, slots=True)
class EmbedResult:
    """One unit vector and the token count per input, in order; milliseconds."""

    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: tuple[int, ...]
    queue_ms: float = 0.0
    compute_ms: float = 0.0


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
    tool_calls: tuple[ToolCallDelta, ...] = ()
    # The last output of a stream handed back unfinished (drain past grace, engine shutdown):
    # the caller continues it elsewhere (finish_reason is ABORT).
    handoff: bool = False
    prompt_text: str = ""  # echo: the prompt, on the first output only
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # echo with logprobs, first output only
    dropped_messages: int = 0  # truncate_oldest: messages left out of the prompt, first output


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
    capabilities: Capabilities = CHAT_ONLY


@runtime_checkable
class Instrumented(Protocol):
    """An engine with telemetry of its own. Engines are built from flags before the worker's
    telemetry exists; ``WorkerServer`` hands over its tracer and meter before ``start()``."""

    def instrument(self, *, tracer: Tracer, meter: Meter) -> None: ...


@runtime_checkable
class ExposesMetrics(Protocol):
    """An engine with Prometheus series of its own for the worker's ``/metrics`` (vLLM's
    ``vllm:*``, with ``--engine-metrics``); ``WorkerServer`` registers them beside Meridian's."""

    def prometheus_collectors(self) -> Sequence[Collector]: ...


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

    async def embed(self, request: EmbedRequest) -> EmbedResult: ...


def check_min_tokens(min_tokens: int | None, max_tokens: int) -> None:
    """``min_tokens`` that cannot fit the completion's budget (its max_tokens, or the room the
    context leaves when none is set) is a 400: generating to the end of the context and then
    stopping short of it would honour neither (engines refuse it the same way)."""
    if min_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequest(
            f"min_tokens ({min_tokens}) is more than this completion may generate "
            f"({max_tokens} tokens: its max_tokens, or what the context leaves)",
            param="min_tokens",
        )
