"""``UpstreamEngine``: the worker's :class:`~services.worker.engine.Engine` in front of an
OpenAI-compatible server (``vllm serve``, SGLang, …) reached over HTTP.

Life cycle: ``start()`` opens one pooled ``aiohttp`` session and asks the upstream's
``GET /v1/models`` which models it serves, retrying for ``start_wait_s`` while it is not up yet
(the worker reports LOADING meanwhile); an upstream that never answers fails the start with an
error that names ``--upstream-url`` (a 401 names ``--upstream-api-key-file``, a model it does
not list names ``--upstream-model``). ``shutdown()`` aborts every stream and closes the pool.

One request (``generate``): model, id and messages are checked before anything is sent
(``ModelNotFound``, ``InvalidRequest``); at most ``max_concurrency`` streams are open upstream
at once (the rest wait here, as ``waiting``); the request goes out as a streaming chat
completion with ``include_usage`` (services/worker/upstream/wire.py), a refusal comes back as
Meridian's error for it (errors.py) — one for the prompt's length, with ``truncate_oldest``, is
sent again without the oldest turns its ``/tokenize`` says must go (truncate.py) — and each
socket read's worth of SSE events becomes one
:class:`EngineOutput` — one token at a time while the worker keeps up, merged when it is
behind. The last output carries the upstream's own usage and finish reason.

Cancellation: cancelling the iterating task or closing the generator closes the upstream
response, which closes its TCP connection (an unfinished body is never returned to the pool),
so the upstream sees the client go away and stops generating. ``abort(request_id)`` does the
same and ends the stream with finish reason "abort".

Load: running/waiting are what this worker has in flight; with a vLLM upstream its own
``/metrics`` gauges (its queue, other clients included, and KV use) are read in the
background and the larger of the two views is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    MeridianError,
    ModelNotFound,
    Unavailable,
    UpstreamFailed,
)
from services.common.logs import event
from services.worker.engine import (
    EmbedRequest,
    EmbedResult,
    Engine,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    ModelDescription,
    ModelState,
)
from services.worker.upstream import errors
from services.worker.upstream.config import UpstreamConfig
from services.worker.upstream.scrape import MAX_METRICS_BYTES, UpstreamLoad, parse_vllm_metrics
from services.worker.upstream.sse import SseError, SseParser
from services.worker.upstream.telemetry import UpstreamTelemetry
from services.worker.upstream.truncate import fit_upstream
from services.worker.upstream.wire import StreamAssembler, request_body

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from opentelemetry.trace import Tracer

log = logging.getLogger("meridian.worker.upstream")

RATE_WINDOW_S = 5.0
MAX_ERROR_BODY_BYTES = 64 * 1024
MAX_MODELS_BODY_BYTES = 4 * 1024 * 1024
_RETRY_START_S = 0.2


class UpstreamStartError(RuntimeError):
    """The upstream could not be used; the message names the flag to look at."""


class _Aborted(Exception):
    """Set on a response's stream by ``abort()``: wakes the read that waits on it."""


@dataclass(slots=True)
class _Stream:
    response: aiohttp.ClientResponse | None = None
    aborted: bool = False

    def was_aborted(self) -> bool:
        """Read fresh at each await point (``abort()`` may run in between)."""
        return self.aborted


class _TokenRate:
    """Tokens relayed in the last ``window_s`` seconds, per second."""

    __slots__ = ("_events", "_total", "_window")

    def __init__(self, window_s: float) -> None:
        self._window = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._total = 0

    def add(self, now: float, tokens: int) -> None:
        if tokens > 0:
            self._events.append((now, tokens))
            self._total += tokens
            self._trim(now)

    def per_second(self, now: float) -> float:
        self._trim(now)
        return self._total / self._window

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self._window:
            self._total -= self._events.popleft()[1]


class UpstreamEngine:
    """The models of one OpenAI-compatible server, relayed. See the module docstring."""

    name = "openai"

    def __init__(self, config: UpstreamConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self._clock = clock
        self._state = ModelState.LOADING
        self._failure: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._served: dict[str, str] = {}  # name clients use → the upstream's name
        self._max_len: dict[str, int] = {}
        self._streams: dict[str, _Stream] = {}
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self._running = 0
        self._waiting = 0
        self._rate = _TokenRate(RATE_WINDOW_S)
        self._upstream_load: UpstreamLoad | None = None
        self._scraper: asyncio.Task[None] | None = None
        self._closing = False
        self._telemetry = UpstreamTelemetry()

    def instrument(self, *, tracer: Tracer, meter: Meter) -> None:
        """Use the worker's tracer and meter (called by ``WorkerServer`` before ``start``)."""
        self._telemetry = UpstreamTelemetry(tracer=tracer, meter=meter)

    # -- life cycle --------------------------------------------------------------------------

    @property
    def state(self) -> ModelState:
        return self._state

    @property
    def failure(self) -> str | None:
        return self._failure

    async def start(self) -> None:
        if self._session is not None:
            raise RuntimeError("UpstreamEngine.start() may be called once")
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        self._session = aiohttp.ClientSession(
            base_url=None,
            headers=headers,
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s),
        )
        try:
            listed = await self._wait_for_models(self._session)
            self._served, self._max_len = self._choose_models(listed)
            if self._closing:
                raise UpstreamStartError("stopped while connecting to the upstream")
            if self.config.scrape_metrics:
                self._scraper = asyncio.create_task(self._scrape_loop(self._session))
        except UpstreamStartError as err:
            self._fail(str(err))
            await self._close_session()
            raise
        except BaseException as err:
            cancelled = isinstance(err, asyncio.CancelledError)
            self._fail("start was cancelled" if cancelled else f"start failed: {err!r}")
            await self._close_session()
            raise
        self._state = ModelState.READY
        event(
            log,
            "upstream.ready",
            url=self.config.base_url,
            models={k: v for k, v in self._served.items()},
        )

    async def shutdown(self) -> None:
        """Abort every stream in flight (each ends with "abort"), then close the pool."""
        self._closing = True
        if self._state is not ModelState.FAILED:
            self._state = ModelState.DRAINING
        for request_id in list(self._streams):
            await self.abort(request_id)
        if self._scraper is not None:
            self._scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scraper
            self._scraper = None
        for _ in range(100):  # let aborted streams end before their connections go
            if not self._streams:
                break
            await asyncio.sleep(0.01)
        await self._close_session()

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    def _fail(self, reason: str) -> None:
        self._state = ModelState.FAILED
        self._failure = reason
        event(log, "upstream.start_failed", level=logging.ERROR, error=reason)

    async def _wait_for_models(self, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
        """``GET /v1/models``, retried until it answers or ``start_wait_s`` has passed."""
        url = f"{self.config.base_url}/models"
        deadline = self._clock.monotonic() + self.config.start_wait_s
        delay = _RETRY_START_S
        while True:
            if self._closing or session.closed:
                raise UpstreamStartError("stopped while waiting for the upstream")
            try:
                return await self._get_models(session, url)
            except _NotYet as err:
                last = str(err)
            if self._clock.monotonic() + delay > deadline:
                raise UpstreamStartError(
                    f"--upstream-url {self.config.base_url}: the upstream does not answer "
                    f"GET {url} (waited {self.config.start_wait_s:g} s, --upstream-wait-s): "
                    f"{last}"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _get_models(self, session: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                async with session.get(url) as resp:
                    if resp.status in (401, 403):
                        raise UpstreamStartError(
                            f"--upstream-api-key-file: the upstream at {self.config.base_url} "
                            f"refuses this worker's credentials (HTTP {resp.status})"
                        )
                    if resp.status != 200:
                        raise _NotYet(f"HTTP {resp.status}")
                    body = await resp.content.read(MAX_MODELS_BODY_BYTES)
        except (aiohttp.ClientError, OSError) as err:
            raise _NotYet(f"{type(err).__name__}: {err}") from None
        except TimeoutError:
            raise _NotYet(f"no answer within {self.config.connect_timeout_s:g} s") from None
        try:
            data = json.loads(body)
            models = data["data"]
            if not isinstance(models, list):
                raise TypeError("data is not a list")
            return [m for m in models if isinstance(m, dict) and isinstance(m.get("id"), str)]
        except (ValueError, KeyError, TypeError, RecursionError) as err:
            raise UpstreamStartError(
                f"--upstream-url {self.config.base_url}: GET {url} did not return an OpenAI "
                f"model list ({type(err).__name__}: {err})"
            ) from None

    def _choose_models(self, listed: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, int]]:
        ids = [m["id"] for m in listed]
        wanted = self.config.upstream_model
        if wanted is not None and wanted not in ids:
            raise UpstreamStartError(
                f"--upstream-model {wanted}: the upstream at {self.config.base_url} serves "
                f"{ids or 'no models'}"
            )
        chosen = [m for m in listed if wanted is None or m["id"] == wanted]
        if not chosen:
            raise UpstreamStartError(
                f"--upstream-url {self.config.base_url}: the upstream serves no models"
            )
        rename = self.config.served_model_name
        if rename is not None and len(chosen) != 1:
            raise UpstreamStartError(
                f"--served-model-name needs one upstream model, and the upstream serves "
                f"{ids}: pick one with --upstream-model"
            )
        served: dict[str, str] = {}
        lengths: dict[str, int] = {}
        for m in chosen:
            name = rename if rename is not None else m["id"]
            served[name] = m["id"]
            upstream_len = m.get("max_model_len")
            length = self.config.max_model_len or (
                upstream_len if isinstance(upstream_len, int) and upstream_len > 0 else 0
            )
            lengths[name] = length
        return served, lengths

    async def _scrape_loop(self, session: aiohttp.ClientSession) -> None:
        url = f"{self.config.origin}/metrics"
        while True:
            try:
                async with asyncio.timeout(self.config.connect_timeout_s):
                    async with session.get(url) as resp:
                        text = (
                            (await resp.content.read(MAX_METRICS_BYTES)).decode("utf-8", "replace")
                            if resp.status == 200
                            else ""
                        )
            except (aiohttp.ClientError, OSError, TimeoutError):
                text = None  # try again next time
            if text is not None:
                load = parse_vllm_metrics(text)
                if load is None and self._upstream_load is None:
                    event(log, "upstream.metrics_absent", url=url)
                    return  # not vLLM: its /metrics will not start having vLLM's gauges
                self._upstream_load = load
            await asyncio.sleep(self.config.scrape_interval_s)

    # -- reports -----------------------------------------------------------------------------

    def models(self) -> list[ModelDescription]:
        names = list(self._served) or [
            n for n in (self.config.served_model_name or self.config.upstream_model,) if n
        ]
        return [
            ModelDescription(
                name=name,
                state=self._state,
                max_model_len=self._max_len.get(name, self.config.max_model_len or 0),
                engine=self.name,
            )
            for name in names
        ]

    @property
    def upstream_load(self) -> UpstreamLoad | None:
        """The vLLM upstream's own gauges, last read (None: not read yet, or not vLLM)."""
        return self._upstream_load

    def in_flight(self) -> frozenset[str]:
        """Ids of the requests open now; one leaves once its upstream stream is closed."""
        return frozenset(self._streams)

    def load(self) -> EngineLoad:
        running, waiting, kv = self._running, self._waiting, 0.0
        up = self._upstream_load
        if up is not None:
            running = max(running, up.running)
            waiting += up.waiting
            kv = up.kv_cache_usage
        return EngineLoad(
            running=running,
            waiting=waiting,
            max_running=self.config.max_concurrency,
            kv_cache_usage=kv,
            tokens_per_second=self._rate.per_second(self._clock.monotonic()),
        )

    # -- requests ----------------------------------------------------------------------------

    async def abort(self, request_id: str) -> None:
        """End one stream with "abort" and close its upstream connection; unknown ids are
        ignored. A request not yet sent is marked and ends as soon as it would be."""
        stream = self._streams.get(request_id)
        if stream is None or stream.aborted:
            return
        stream.aborted = True
        if stream.response is not None:
            stream.response.content.set_exception(_Aborted())
            stream.response.close()

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """Not served: this engine fronts an upstream's chat completions only, and reports no
        embeddings capability, so routers send it no Embed call; one that arrives anyway is
        refused naming the input."""
        raise InvalidRequest(
            f"{request.model} on this worker serves chat completions only (--engine openai)",
            param="input",
        )

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        session = self._ready()
        upstream_model = self._served.get(request.model)
        if upstream_model is None:
            raise ModelNotFound(
                f"The model '{request.model}' does not exist on this worker "
                f"(it serves {sorted(self._served)}).",
                param="model",
            )
        if not request.request_id:
            raise InvalidRequest("request_id must not be empty", param="request_id")
        if not request.messages:
            raise InvalidRequest("messages must not be empty", param="messages")
        if request.request_id in self._streams:
            raise InvalidRequest(
                f"request {request.request_id!r} is already in flight", param="request_id"
            )
        stream = _Stream()
        self._streams[request.request_id] = stream
        url = f"{self.config.base_url}/chat/completions"
        span = self._telemetry.start(
            request_id=request.request_id,
            model=request.model,
            url=url,
            traceparent=request.traceparent,
        )
        started = self._clock.monotonic()
        first_at: float | None = None
        outcome, error = "cancelled", None
        assembler = StreamAssembler()
        dropped = 0  # truncate_oldest: the oldest messages fit_upstream left out
        try:
            self._waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self._waiting -= 1
            self._running += 1
            try:
                if stream.was_aborted():  # aborted (or shut down) while it waited for a slot
                    outcome = "aborted"
                    yield self._aborted(assembler)
                    return
                try:
                    resp = await self._open(session, url, request, upstream_model, span)
                except ContextLengthExceeded as refusal:
                    if not request.truncate_oldest:
                        raise
                    request, dropped = await fit_upstream(
                        session,
                        origin=self.config.origin,
                        upstream_model=upstream_model,
                        request=request,
                        max_model_len=self._max_len.get(request.model, 0),
                        refusal=refusal,
                        timeout_s=self.config.connect_timeout_s,
                    )
                    if stream.was_aborted():
                        outcome = "aborted"
                        yield self._aborted(assembler)
                        return
                    # Refused again (the upstream counts differently): its refusal stands.
                    resp = await self._open(session, url, request, upstream_model, span)
                stream.response = resp
                if stream.was_aborted():  # while the request was being sent
                    resp.close()
                    outcome = "aborted"
                    yield self._aborted(assembler)
                    return
                parser = SseParser()
                content = resp.content
                counted = 0
                while True:
                    try:
                        data = await content.readany()
                    except _Aborted:
                        outcome = "aborted"
                        yield self._aborted(assembler)
                        return
                    except (aiohttp.ClientError, OSError) as err:
                        raise UpstreamFailed(
                            f"the upstream connection broke mid-stream: {type(err).__name__}"
                        ) from None
                    if not data:
                        final = assembler.ended_without_finish()
                        if final is None:
                            raise UpstreamFailed("the upstream ended the stream before finishing")
                        outcome = "ok"
                        self._timings(final, started, first_at, last=True)
                        yield final
                        return
                    try:
                        out = assembler.feed(parser.feed(data))
                    except SseError as err:
                        raise UpstreamFailed(f"unreadable upstream stream: {err}") from None
                    if out is None:
                        continue
                    if dropped:  # said on the first output
                        out = dataclasses.replace(out, dropped_messages=dropped)
                        dropped = 0
                    now = self._clock.monotonic()
                    self._rate.add(now, out.completion_tokens - counted)
                    counted = out.completion_tokens
                    if first_at is None and (out.text or out.logprobs):
                        first_at = now
                        span.add_event("first_token")
                        self._timings(out, started, first_at, last=False)
                    if assembler.done:
                        outcome = "ok"
                        self._timings(out, started, first_at, last=True)
                        yield out
                        return
                    yield out
            finally:
                self._running -= 1
                self._slots.release()
        except MeridianError as err:
            outcome = _outcome(err)
            error = err.message
            raise
        finally:
            if stream.response is not None:
                stream.response.close()  # an unfinished body closes its connection
            self._streams.pop(request.request_id, None)
            self._telemetry.end(
                span,
                request_id=request.request_id,
                model=request.model,
                outcome=outcome,
                status=stream.response.status if stream.response is not None else None,
                completion_tokens=assembler.completion_tokens,
                ttft_s=None if first_at is None else first_at - started,
                duration_s=self._clock.monotonic() - started,
                error=error,
            )

    def _ready(self) -> aiohttp.ClientSession:
        if self._state is ModelState.READY and self._session is not None:
            return self._session
        reason = {
            ModelState.LOADING: "the upstream is not connected yet",
            ModelState.DRAINING: "the worker is draining",
            ModelState.FAILED: f"the upstream failed: {self._failure}",
        }.get(self._state, "the engine is not ready")
        raise Unavailable(f"{reason}; retry on another worker")

    async def _open(
        self,
        session: aiohttp.ClientSession,
        url: str,
        request: EngineRequest,
        upstream_model: str,
        span: Any,
    ) -> aiohttp.ClientResponse:
        headers = {
            "Accept": "text/event-stream",
            "X-Request-Id": request.request_id,
            **self._telemetry.headers(span),
        }
        body = request_body(request, upstream_model)
        timeout = self.config.connect_timeout_s
        try:
            async with asyncio.timeout(timeout):
                resp = await session.post(url, json=body, headers=headers)
        except TimeoutError:
            raise Unavailable(f"the upstream did not answer within {timeout:g} s") from None
        except (aiohttp.ClientError, OSError) as err:
            raise Unavailable(
                f"the upstream {self.config.origin} is unreachable: {type(err).__name__}"
            ) from None
        if resp.status != 200:
            try:
                async with asyncio.timeout(timeout):
                    detail = await resp.content.read(MAX_ERROR_BODY_BYTES)
            except (aiohttp.ClientError, OSError, TimeoutError):
                detail = b""
            finally:
                resp.close()
            raise errors.from_status(resp.status, detail, resp.headers)
        if not resp.content_type.startswith("text/event-stream"):
            resp.close()
            raise UpstreamFailed(
                f"the upstream answered a streaming request with {resp.content_type!r}, "
                "not text/event-stream"
            )
        return resp

    def _aborted(self, assembler: StreamAssembler) -> EngineOutput:
        return EngineOutput(
            text="",
            finish_reason=FinishReason.ABORT,
            prompt_tokens=assembler.prompt_tokens,
            completion_tokens=assembler.completion_tokens,
        )

    def _timings(
        self, out: EngineOutput, started: float, first_at: float | None, *, last: bool
    ) -> None:
        """Measured here: prefill = first token − request sent (queue included, so queue_ms
        stays unset); decode = last token − first token."""
        if first_at is None:
            return
        out.prefill_ms = (first_at - started) * 1000.0
        if last:
            out.decode_ms = (self._clock.monotonic() - first_at) * 1000.0


class _NotYet(Exception):
    """The upstream did not answer ``/v1/models`` (yet): retried until ``start_wait_s``."""


def _outcome(err: MeridianError) -> str:
    if isinstance(err, UpstreamFailed):
        return "failed"
    if isinstance(err, Unavailable) and "unreachable" in err.message:
        return "unreachable"
    return "refused"


if TYPE_CHECKING:
    _conforms: type[Engine] = UpstreamEngine  # mypy holds UpstreamEngine to the seam's protocol
