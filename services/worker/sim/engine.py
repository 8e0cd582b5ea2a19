"""``SimEngine``: the :class:`~services.worker.engine.Engine` that runs the simulator in real time.

One loop task drives the pure :class:`~services.worker.sim.scheduler.SimScheduler`: begin a
step, sleep its duration, end it, hand each output to its request's collector. Sleep targets
are kept on an ideal timeline (each step starts where the previous one should have ended), so
event-loop wake-up lateness does not accumulate into a slower GPU; if the loop falls more than
``MAX_LAG_S`` behind (a stalled process) the timeline is reset rather than replayed in a burst.
With nothing to compute the loop waits on an event that ``generate`` and ``abort`` set: no
polling while idle.

Per-request delivery works like vLLM's ``RequestOutputCollector``: a consumer that reads slower
than the engine steps gets the pending outputs merged into one (text and tokens concatenated,
latest usage), never an unbounded backlog.

Cancelling the task that iterates :meth:`SimEngine.generate`, or closing the generator, aborts
the request in the scheduler at once (its KV blocks are free before the next step).
:meth:`SimEngine.abort` does the same and ends a live stream with ``finish_reason=abort``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from services.common.capabilities import Capabilities
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import (
    InternalError,
    InvalidRequest,
    MeridianError,
    ModelNotFound,
    Unavailable,
)
from services.common.limits import MAX_CHOICES
from services.worker.engine import (
    EmbedRequest,
    EmbedResult,
    Engine,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    ModelDescription,
    ModelState,
    ToolCallDelta,
)
from services.worker.sim import embed
from services.worker.sim.config import SimConfig
from services.worker.sim.scheduler import SimScheduler
from services.worker.sim.validation import echo_logprobs, raw_prompt

MAX_LAG_S = 0.25
_log = logging.getLogger(__name__)


class _Collector:
    """The outputs of one request not yet read by its consumer, merged; or the error that
    ended the engine under it."""

    __slots__ = ("_error", "_pending", "_ready")

    def __init__(self) -> None:
        self._pending: EngineOutput | None = None
        self._error: MeridianError | None = None
        self._ready = asyncio.Event()

    def put(self, out: EngineOutput) -> None:
        self._pending = out if self._pending is None else merge_outputs(self._pending, out)
        self._ready.set()

    def fail(self, error: MeridianError) -> None:
        self._error = error
        self._ready.set()

    async def get(self) -> EngineOutput:
        await self._ready.wait()
        out, self._pending = self._pending, None
        self._ready.clear()
        if out is None:
            assert self._error is not None
            raise self._error
        return out


def merge_outputs(first: EngineOutput, later: EngineOutput) -> EngineOutput:
    """One output equivalent to ``first`` followed by ``later``: deltas concatenated, usage and
    finish from ``later``, each timing from whichever output has it (first one wins)."""
    return dataclasses.replace(
        later,
        text=first.text + later.text,
        token_ids=first.token_ids + later.token_ids,
        logprobs=first.logprobs + later.logprobs,
        tool_calls=merge_tool_calls(first.tool_calls, later.tool_calls),
        queue_ms=first.queue_ms if first.queue_ms is not None else later.queue_ms,
        prefill_ms=first.prefill_ms if first.prefill_ms is not None else later.prefill_ms,
        decode_ms=later.decode_ms if later.decode_ms is not None else first.decode_ms,
    )


def merge_tool_calls(
    first: tuple[ToolCallDelta, ...], later: tuple[ToolCallDelta, ...]
) -> tuple[ToolCallDelta, ...]:
    """Tool-call pieces of two outputs as one: adjacent pieces of the same call joined (the
    first keeps its id and name), so a merged output still holds one delta per call."""
    if not first or not later:
        return first or later
    out = list(first)
    for delta in later:
        prev = out[-1]
        if prev.index == delta.index and not delta.id:
            out[-1] = dataclasses.replace(prev, arguments=prev.arguments + delta.arguments)
        else:
            out.append(delta)
    return tuple(out)


class SimEngine:
    """A simulated GPU inference server behind the worker's engine seam.

    ``config`` sets the model (see :class:`SimConfig`); ``clock`` is the monotonic clock the
    timeline, timings and load windows are read from (the real one in production).
    """

    name = "sim"

    def __init__(self, config: SimConfig | None = None, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config if config is not None else SimConfig()
        self._clock = clock
        self._scheduler = SimScheduler(self.config)
        self._collectors: dict[str, _Collector] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._state = ModelState.LOADING

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the model (``load_delay_s`` of modelled time), start the step loop, go READY."""
        if self._loop_task is not None:
            return
        self._state = ModelState.LOADING
        delay = self.config.load_delay_s * self.config.time_scale
        if delay > 0:
            await asyncio.sleep(delay)
        if self._state is not ModelState.LOADING or self._loop_task is not None:
            return  # shut down (or started by someone else) while loading
        self._loop_task = asyncio.create_task(self._run(), name="sim-engine-loop")
        self._loop_task.add_done_callback(self._loop_ended)
        self._state = ModelState.READY

    async def shutdown(self) -> None:
        """Stop accepting work, end every live stream with ``abort`` and stop the loop."""
        self._state = ModelState.DRAINING
        now = self._clock.monotonic()
        for request_id in self._scheduler.request_ids():
            self._abort_now(request_id, now)
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- reads --------------------------------------------------------------------------------

    def models(self) -> list[ModelDescription]:
        return [
            ModelDescription(
                name=name,
                state=self._state,
                max_model_len=self.config.max_model_len,
                engine=self.name,
                capabilities=self._capabilities,
            )
            for name in self.config.models
        ]

    @functools.cached_property
    def _capabilities(self) -> Capabilities:
        c = self.config
        return Capabilities(
            chat=True,
            completions=c.completions,
            embeddings=c.embeddings,
            max_context_len=c.max_model_len,
            embedding_dimensions=c.embedding_dimensions if c.embeddings else 0,
            dimensions_configurable=c.embeddings,
            echo=c.completions,
            max_logprobs=20,
            max_embedding_inputs=2048 if c.embeddings else 0,
            # Scripted tool calls and schema-valid JSON (sim/script.py, sim/jsongen.py).
            tools=True,
            tool_parser="sim",
            structured_outputs=True,
            structured_output_backend="jsongen",
            max_n=MAX_CHOICES,
        )

    def load(self) -> EngineLoad:
        return self._scheduler.load(self._clock.monotonic())

    # -- requests -----------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """Stream ``request``'s outputs. Raises before the first output for a request that can
        never succeed, and ``Unavailable`` while the model is not ready."""
        if self._state is not ModelState.READY:
            self._scheduler.check(request)  # a request that can never succeed says so first
            raise Unavailable(f"model {request.model!r} is {self._state.value}")
        seq = self._scheduler.add(request, self._clock.monotonic())
        collector = _Collector()
        self._collectors[request.request_id] = collector
        self._wake.set()
        echo = request.echo and request.prompt is not None
        dropped = seq.dropped_messages  # said on the first output
        try:
            while True:
                out = await collector.get()
                if echo:
                    echo = False
                    out = self._with_echo(out, request)
                if dropped:
                    out = dataclasses.replace(out, dropped_messages=dropped)
                    dropped = 0
                yield out
                if out.finish_reason is not None:
                    return
        finally:
            if self._collectors.get(request.request_id) is collector:
                del self._collectors[request.request_id]
                self._scheduler.abort(request.request_id, self._clock.monotonic())
                self._wake.set()

    @staticmethod
    def _with_echo(out: EngineOutput, request: EngineRequest) -> EngineOutput:
        """The first output with the prompt (and its logprobs) in front, as echo asks."""
        assert request.prompt is not None
        sampling = request.sampling
        text, _ = raw_prompt(request.prompt)
        lps = echo_logprobs(request.prompt, sampling.top_logprobs) if sampling.logprobs else ()
        return dataclasses.replace(out, prompt_text=text, prompt_logprobs=lps)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """Deterministic unit vectors (``sim/embed.py``), after a modelled prefill."""
        c = self.config
        if request.model not in c.models:
            raise ModelNotFound(f"model {request.model!r} is not served here", param="model")
        if not c.embeddings:
            raise InvalidRequest("this model does not serve embeddings", param="input")
        ids = await embed.check_inputs(
            request.inputs,
            max_model_len=c.max_model_len,
            size=c.embedding_dimensions,
            dimensions=request.dimensions,
        )
        if self._state is not ModelState.READY:
            raise Unavailable(f"model {request.model!r} is {self._state.value}")
        started = self._clock.monotonic()
        tokens = tuple(len(x) for x in ids)
        await asyncio.sleep(c.prefill_ms_per_token * sum(tokens) / 1000 * c.time_scale)
        vectors = await embed.embed_all(ids, c.embedding_dimensions, request.dimensions)
        return EmbedResult(
            vectors=vectors,
            prompt_tokens=tokens,
            compute_ms=(self._clock.monotonic() - started) * 1000,
        )

    async def abort(self, request_id: str) -> None:
        self._abort_now(request_id, self._clock.monotonic())

    def _abort_now(self, request_id: str, now: float) -> None:
        final = self._scheduler.abort(request_id, now)
        collector = self._collectors.pop(request_id, None)
        if final is not None and collector is not None:
            collector.put(final)
        self._wake.set()

    # -- the engine loop ----------------------------------------------------------------------

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """A loop that dies of a bug must not leave streams hanging: fail them and the model."""
        if task.cancelled() or task.exception() is None:
            return
        _log.error("simulated engine loop failed", exc_info=task.exception())
        self._state = ModelState.FAILED
        if self._loop_task is task:
            self._loop_task = None
        collectors, self._collectors = self._collectors, {}
        for collector in collectors.values():
            collector.fail(InternalError("the simulated engine failed"))

    async def _run(self) -> None:
        scheduler = self._scheduler
        timeline: float | None = None  # ideal start of the next step; None while idle
        while True:
            now = self._clock.monotonic()
            if timeline is None or now - timeline > MAX_LAG_S:
                timeline = now
            plan = scheduler.begin_step(timeline)
            if plan is None:
                timeline = None
                self._wake.clear()
                await self._wake.wait()
                continue
            end = timeline + plan.duration_s
            try:
                await asyncio.sleep(max(0.0, end - self._clock.monotonic()))
            finally:
                outputs = scheduler.end_step(end)
            timeline = end
            for request_id, out in outputs.items():
                collector = self._collectors.get(request_id)
                if collector is None:
                    continue
                collector.put(out)
                if out.finish_reason is not None:
                    del self._collectors[request_id]


if TYPE_CHECKING:
    _: type[Engine] = SimEngine  # the type checker holds SimEngine to the engine seam
