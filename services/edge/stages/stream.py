"""The ``stream`` stage, terminal: open the token stream (with failover) and answer the
client, as SSE chunks or as one ``chat.completion`` object.

Streaming: HTTP headers are committed when the first token arrives, so anything that fails
before that is a proper HTTP error. If the first token takes longer than
``keepalive_after_s``, headers are committed early and SSE comments keep the connection alive;
a failure after that point is sent as an SSE ``error`` payload (then ``[DONE]``), which the
OpenAI SDK raises.

Mid-stream breaks (the worker dies, stalls, drains) are not failures yet: the chunks come
through :class:`~services.edge.migration.driver.MigratingStream`, which moves the stream to
another worker and continues it; the final chunk (and a non-streamed completion) carries
``"meridian": {"migrations": N, "region": ..., "worker": ...}``.

Client disconnect: aiohttp cancels this handler (``handler_cancellation=True``); the ``finally``
cancels the worker call, which aborts the generation in the engine, and the admit stage settles
the reservation with the tokens generated so far (``ctx.tokens_used``, updated per chunk). A
client that stops *reading* is treated the same way once one write has waited
``write_timeout_s``: its connection is aborted.

Cuts: a request still running when the edge's drain grace ends, or whose key is revoked
meanwhile, is cut (:meth:`services.edge.guard.Lifecycle.cut`, ``cut_where``) in the scope it is
in: an SSE stream whose headers are sent gets one last ``error`` event (the cut's
:class:`~services.edge.httperrors.Interrupted`: ``edge_shutting_down``, ``invalid_api_key``,
in the format of any mid-stream error) and ``[DONE]``, written within
:data:`CUT_WRITE_TIMEOUT_S`; one that has sent nothing, its status (503, 401). Either way the
worker call is cancelled and the reservation settled with the tokens used, as for a client
that leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, Protocol, TypeVar

from aiohttp import web
from opentelemetry import trace

from meridian.v1 import worker_pb2
from services.common.errors import MeridianError
from services.common.logs import event
from services.edge.chunk_merge import merge_while_behind
from services.edge.context import ChatContext
from services.edge.counters import EdgeCounters
from services.edge.guard import cut_scope
from services.edge.httperrors import Interrupted
from services.edge.migration.driver import MigratingStream
from services.edge.migration.policy import MigrationPolicy
from services.edge.migration.refusal import migration_refusal
from services.edge.observability import EdgeTelemetry
from services.edge.offload import answer_items, json_answer
from services.edge.openai_types import ChatCompletionRequest, now_s
from services.edge.protocol import GuardedRequestHandler
from services.edge.render import (
    FINISH_REASONS,
    SSE_DONE,
    SSE_KEEPALIVE,
    ChoiceAssembler,
    ChunkRenderer,
    completion_body,
    sse_data,
)
from services.edge.upstream import protos
from services.edge.upstream.failover import FailoverPolicy, OutcomeSink, UpstreamStream, open_stream
from services.edge.upstream.worker_pool import WorkerPool

log = logging.getLogger("meridian.edge")

_Opened = TypeVar("_Opened")


#: Below this many unsent bytes a write does not wait for the client (aiohttp/uvloop pause
#: writing at 64 KiB).
_BACKED_UP_BYTES = 32 * 1024

#: The most a stream cut at the drain deadline spends on its last event: the process is
#: about to exit, and a client that does not read loses the event, not the drain's time.
CUT_WRITE_TIMEOUT_S = 0.5


def _answer_items(body: ChatCompletionRequest, last: worker_pb2.GenerateChunk) -> int:
    return answer_items(
        last.usage.completion_tokens,
        logprobs=bool(body.logprobs),
        top_logprobs=body.top_logprobs or 0,
    )


class FleetView(Protocol):
    """What the stream stage asks the edge's copy of the router view (ResilientRouter)."""

    def serving_workers(self, model: str, allowed_regions: Sequence[str]) -> int | None: ...


class ClientGone(Exception):
    """The client disconnected or stopped reading; nothing more can be sent."""


def _track_usage(ctx: ChatContext, chunk: worker_pb2.GenerateChunk) -> None:
    ctx.tokens_used = chunk.usage.prompt_tokens + chunk.usage.completion_tokens


def chat_sse_ending(err: MeridianError) -> bytes:
    """The last events of a chat (or completions) stream that fails after its headers went
    out: the error in OpenAI's format, then ``[DONE]``."""
    return sse_data(err.to_openai()) + SSE_DONE


class Stream:
    """The terminal stage (see the module docstring)."""

    name = "stream"

    def __init__(
        self,
        *,
        router: OutcomeSink,
        workers: WorkerPool,
        policy: FailoverPolicy,
        counters: EdgeCounters,
        migration: MigrationPolicy | None = None,
        fleet: FleetView | None = None,
        telemetry: EdgeTelemetry | None = None,
        keepalive_after_s: float = 3.0,
        keepalive_every_s: float = 10.0,
        write_timeout_s: float = 30.0,
    ) -> None:
        self._router = router
        self._workers = workers
        self._policy = policy
        self._migration = migration or MigrationPolicy()
        self._fleet = fleet
        # A migratable stream is watched for stalls at the migration threshold, not at the
        # (much longer) idle limit that ends an unmigratable one.
        self._stall_policy = dataclasses.replace(
            policy,
            stream_idle_timeout_s=min(policy.stream_idle_timeout_s, self._migration.stall_s),
        )
        self._counters = counters
        self._telemetry = telemetry or EdgeTelemetry(counters=counters, active_streams=lambda: 0)
        self._keepalive_after_s = keepalive_after_s
        self._keepalive_every_s = keepalive_every_s
        self._write_timeout_s = write_timeout_s

    #: The structured log line of a finished request, and its GenAI operation name.
    done_event = "chat.completed"
    operation = "chat"

    async def __call__(self, ctx: ChatContext) -> web.StreamResponse:
        assert ctx.body is not None and ctx.route is not None and ctx.reroute is not None

        def generate(request_id: str, decision_id: str) -> worker_pb2.GenerateRequest:
            return protos.generate_request(ctx, request_id=request_id, decision_id=decision_id)

        refusal = migration_refusal(ctx.body)
        migratable = self._migration.enabled and refusal is None
        policy = self._stall_policy if migratable and self._elsewhere(ctx) else self._policy
        reroute = ctx.reroute

        def migrating(first: UpstreamStream) -> MigratingStream:
            return MigratingStream(
                first=first,
                request_id=ctx.request_id,
                refusal=refusal,
                policy=self._migration,
                failover=policy,
                reroute=reroute,
                outcomes=self._router,
                workers=self._workers,
                generate=generate,
                record=self._telemetry.record_migration,
                tracer=self._telemetry.tracer,
            )

        opening = asyncio.ensure_future(
            open_stream(
                first_route=ctx.route,
                reroute=ctx.reroute,
                outcomes=self._router,
                workers=self._workers,
                request_id=ctx.request_id,
                generate=generate,
                policy=policy,
                tracer=self._telemetry.tracer,
                choices=ctx.body.choices(),
            )
        )
        self._note_features(ctx.body)
        try:
            if ctx.body.stream:
                return await self._stream(ctx, ctx.body, opening, migrating)
            async with cut_scope(ctx.in_flight):  # cut at the drain deadline: a 503
                return await self._complete(ctx, ctx.body, opening, migrating)
        except asyncio.CancelledError:
            self._counters.client_disconnects += 1
            raise
        finally:
            if not opening.done():
                opening.cancel()
                with contextlib.suppress(asyncio.CancelledError, MeridianError):
                    await opening

    def _note_features(self, body: ChatCompletionRequest) -> None:
        """Span attributes and counters for the features a request asks for (plain chat: none)."""
        n = body.choices()
        fmt = body.response_format_type()
        if not body.tools and n == 1 and fmt == "text":
            return
        span = trace.get_current_span()
        span.set_attribute("gen_ai.request.choice.count", n)
        span.set_attribute("meridian.tools.count", len(body.tools or ()))
        span.set_attribute("meridian.tool_choice", body.tool_choice_mode())
        span.set_attribute("meridian.response_format", fmt)
        if body.tools:
            self._counters.tool_requests += 1
        if fmt != "text":
            self._counters.structured_output_requests += 1
        if n > 1:
            self._counters.multi_choice_requests += 1

    def _note_tool_calls(self, calls: int) -> None:
        if calls:
            self._counters.tool_calls_returned += calls
            trace.get_current_span().set_attribute("meridian.tool_calls", calls)

    def _elsewhere(self, ctx: ChatContext) -> bool:
        """Whether a stalled stream could move: another worker serves its model where the
        tenant may run (or the view is unknown). A stream with nowhere to go keeps the long
        idle limit rather than being cut off for a pause it might recover from."""
        if self._fleet is None or ctx.body is None or ctx.principal is None:
            return True
        regions = ctx.principal.tenant.allowed_regions
        serving = self._fleet.serving_workers(ctx.body.model, list(regions))
        return serving is None or serving > 1

    async def _complete(
        self,
        ctx: ChatContext,
        body: ChatCompletionRequest,
        opening: asyncio.Future[UpstreamStream],
        migrating: _Migrating,
    ) -> web.StreamResponse:
        if body.tools or body.choices() > 1:
            return await self._complete_choices(ctx, body, opening, migrating)
        stream = migrating(await opening)
        text: list[str] = []
        logprobs: list[worker_pb2.TokenLogprob] | None = [] if body.logprobs else None
        last = stream.current.first
        try:
            async with contextlib.aclosing(stream.chunks()) as chunks:
                async for chunk in chunks:
                    _track_usage(ctx, chunk)
                    text.append(chunk.text)
                    if logprobs is not None:
                        logprobs.extend(chunk.logprobs)
                    last = chunk
        finally:
            stream.cancel()
        self._log_done(ctx, stream, last)
        self._counters.completions += 1
        created, fingerprint, extension = now_s(), _fingerprint(stream.current), _extension(stream)
        return await json_answer(
            lambda: completion_body(
                completion_id=ctx.request_id,
                model=body.model,
                created=created,
                fingerprint=fingerprint,
                text="".join(text),
                finish=FINISH_REASONS.get(last.finish_reason, "stop"),
                usage=last.usage,
                logprobs=logprobs,
                extension=extension,
            ),
            items=_answer_items(body, last),
            headers={**ctx.headers, **_route_headers(stream.current, stream)},
        )

    async def _complete_choices(
        self,
        ctx: ChatContext,
        body: ChatCompletionRequest,
        opening: asyncio.Future[UpstreamStream],
        migrating: _Migrating,
    ) -> web.StreamResponse:
        """A completion with several choices or tool calls (ChoiceAssembler joins them)."""
        stream = migrating(await opening)
        choices = ChoiceAssembler(choices=body.choices(), logprobs=bool(body.logprobs))
        last = stream.current.first
        try:
            async with contextlib.aclosing(stream.chunks()) as chunks:
                async for chunk in chunks:
                    _track_usage(ctx, chunk)
                    choices.add(chunk)
                    last = chunk
        finally:
            stream.cancel()
        self._log_done(ctx, stream, last, tool_calls=choices.tool_calls())
        self._note_tool_calls(choices.tool_calls())
        self._counters.completions += 1
        created, fingerprint, extension = now_s(), _fingerprint(stream.current), _extension(stream)
        return await json_answer(
            lambda: completion_body(
                completion_id=ctx.request_id,
                model=body.model,
                created=created,
                fingerprint=fingerprint,
                text="",
                finish="stop",
                usage=last.usage,
                logprobs=None,
                choices=choices.choices(),
                extension=extension,
            ),
            items=_answer_items(body, last),
            headers={**ctx.headers, **_route_headers(stream.current, stream)},
        )

    async def _stream(
        self,
        ctx: ChatContext,
        body: ChatCompletionRequest,
        opening: asyncio.Future[UpstreamStream],
        migrating: _Migrating,
    ) -> web.StreamResponse:
        opened = await self._open_sse(ctx, opening, lambda up: _route_headers(up, None))
        if isinstance(opened, web.StreamResponse):
            return opened  # it ended before its first token
        resp, upstream = opened
        stream = migrating(upstream)
        render = ChunkRenderer(
            completion_id=ctx.request_id,
            model=body.model,
            created=now_s(),
            fingerprint=_fingerprint(upstream),
            usage=body.include_usage(),
        )
        last = upstream.first
        tool_calls = 0
        finished = 0
        try:
            async with cut_scope(ctx.in_flight):
                for index in range(body.choices()):
                    await self._write(ctx, resp, render.role(index))
                async with contextlib.aclosing(self._merged(ctx, stream.chunks())) as chunks:
                    async for chunk in chunks:
                        last = chunk
                        _track_usage(ctx, chunk)
                        data = render.content(chunk)
                        if data is not None:
                            await self._write(ctx, resp, data)
                        if chunk.tool_calls:
                            tool_calls += sum(1 for c in chunk.tool_calls if c.id)
                        if chunk.finish_reason != worker_pb2.FINISH_REASON_UNSPECIFIED:
                            # Each choice's own finish chunk, as it ends (n > 1 interleaves
                            # them); the migration extension rides on each (final by then).
                            finished += 1
                            reason = FINISH_REASONS.get(chunk.finish_reason, "stop")
                            await self._write(
                                ctx, resp, render.finish(reason, chunk.index, _extension(stream))
                            )
                ext = _extension(stream)
                if not finished:
                    reason = FINISH_REASONS.get(last.finish_reason, "stop")
                    await self._write(ctx, resp, render.finish(reason, 0, ext))
                if body.include_usage():
                    await self._write(ctx, resp, render.usage(last.usage, ext))
                await self._write(ctx, resp, SSE_DONE)
                self._counters.completions += 1
        except Interrupted as err:
            stream.cancel()  # the worker stops now, not after the last write
            await self._end_cut(ctx, resp, err)
        except MeridianError as err:
            self._note_failed(ctx, err, stream.migrations)
            with contextlib.suppress(ClientGone):
                await self._write(ctx, resp, chat_sse_ending(err))
        except ClientGone:
            pass
        finally:
            stream.cancel()
            self._log_done(ctx, stream, last, tool_calls=tool_calls)
            self._note_tool_calls(tool_calls)
        return resp

    def _note_failed(self, ctx: ChatContext, err: MeridianError, migrations: int) -> None:
        """A stream that failed after its headers: its counter and its log line."""
        self._counters.stream_errors += 1
        event(
            log,
            "stream.failed",
            level=logging.WARNING,
            request_id=ctx.request_id,
            error=err.message,
            migrations=migrations,
        )

    def _merged(
        self, ctx: ChatContext, chunks: AsyncGenerator[worker_pb2.GenerateChunk, None]
    ) -> AsyncGenerator[worker_pb2.GenerateChunk, None]:
        """``chunks``, merged while the client is behind (services/edge/chunk_merge.py); as
        they are on a connection that cannot say when it caught up (not the edge's own
        protocol: an embedding app's)."""
        transport = ctx.request.transport
        protocol = ctx.request.protocol
        if transport is None or not isinstance(protocol, GuardedRequestHandler):
            return chunks
        counters = self._counters

        def behind() -> bool:
            return transport.get_write_buffer_size() > 0

        def merged(n: int) -> None:
            counters.chunks_merged += n
            counters.merged_events += 1

        return merge_while_behind(
            chunks, behind=behind, drained=protocol.until_drained, on_merged=merged
        )

    async def _write(self, ctx: ChatContext, resp: web.StreamResponse, data: bytes) -> None:
        """One write, bounded in time: a client that stopped reading (or left) is cut off.

        A write can only wait when the socket's buffer is backed up (the client is not
        reading); while it is not, and this write will not back it up (a merged event can be
        large), the write returns at once and the timer — measurable per token on the hot
        path — is skipped.
        """
        transport = ctx.request.transport
        try:
            if (
                transport is not None
                and transport.get_write_buffer_size() + len(data) < _BACKED_UP_BYTES
            ):
                await resp.write(data)
                return
            async with asyncio.timeout(self._write_timeout_s):
                await resp.write(data)
        except TimeoutError:
            self._counters.write_timeouts += 1
            transport = ctx.request.transport
            if transport is not None:
                transport.abort()
            raise ClientGone from None
        except ConnectionError:
            self._counters.client_disconnects += 1
            raise ClientGone from None

    async def _end_cut(
        self,
        ctx: ChatContext,
        resp: web.StreamResponse,
        err: Interrupted,
        ending: Callable[[MeridianError], bytes] = chat_sse_ending,
    ) -> None:
        """A stream cut (the drain deadline, its key revoked): its last events say why
        (``ending``: chat's error event and ``[DONE]``), in one write bounded by
        :data:`CUT_WRITE_TIMEOUT_S` (a client that does not read is cut off)."""
        try:
            async with asyncio.timeout(CUT_WRITE_TIMEOUT_S):
                await resp.write(ending(err))
        except (TimeoutError, ConnectionError):
            transport = ctx.request.transport
            if transport is not None:
                transport.abort()

    async def _open_sse(
        self,
        ctx: ChatContext,
        opening: asyncio.Future[_Opened],
        headers: Callable[[_Opened], dict[str, str]],
        ending: Callable[[MeridianError], bytes] = chat_sse_ending,
    ) -> tuple[web.StreamResponse, _Opened] | web.StreamResponse:
        """Wait for ``opening`` (the stream's first chunk); when it is slow, commit the SSE
        headers after ``keepalive_after_s`` and send a keep-alive comment every
        ``keepalive_every_s`` so that proxies and clients do not time the connection out.

        Returns the response and what opened, with ``headers(opened)`` as its route headers
        when it opened in time; or the response alone when the stream has already ended
        here — an error event and ``[DONE]`` after the headers went out, a drain's cut,
        a client that left — and is to be returned as it is. An error before anything was
        sent (and a drain then) is raised: the client gets a plain JSON error. ``ending``
        renders the last events of a stream that fails after its headers (the endpoint's own
        shape; chat's: an error event and ``[DONE]``).
        """
        resp: web.StreamResponse | None = None
        try:
            async with cut_scope(ctx.in_flight):
                done, _ = await asyncio.wait({opening}, timeout=self._keepalive_after_s)
                if not done:
                    resp = await self._start_sse(ctx, {})
                    while True:
                        done, _ = await asyncio.wait({opening}, timeout=self._keepalive_every_s)
                        if done:
                            break
                        await self._write(ctx, resp, SSE_KEEPALIVE)
                try:
                    opened = opening.result()
                except MeridianError as err:
                    if resp is None:
                        raise
                    self._counters.stream_errors += 1
                    await self._write(ctx, resp, ending(err))
                    return resp
                if resp is None:
                    resp = await self._start_sse(ctx, headers(opened))
        except ClientGone:
            assert resp is not None
            return resp
        except Interrupted as err:
            if resp is None:
                raise  # nothing sent yet: a 503
            await self._end_cut(ctx, resp, err, ending)
            return resp
        return resp, opened

    async def _start_sse(self, ctx: ChatContext, extra: dict[str, str]) -> web.StreamResponse:
        if ctx.in_flight is not None:
            ctx.in_flight.streaming = True  # from here a cut is an SSE event, not a 503
        resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **ctx.headers,
                **extra,
            },
        )
        await resp.prepare(ctx.request)
        return resp

    def _log_done(
        self,
        ctx: ChatContext,
        stream: MigratingStream | UpstreamStream,
        last: worker_pb2.GenerateChunk,
        *,
        tool_calls: int = 0,
    ) -> None:
        """The request's metrics and its log line. ``stream``: a chat stream (which may have
        migrated), or one of a completions request's plain streams."""
        if isinstance(stream, MigratingStream):
            upstream, migrations = stream.current, stream.migrations
        else:
            upstream, migrations = stream, 0
        self._telemetry.record_completion(
            model=ctx.model or (ctx.body.model if ctx.body else ""),
            operation=self.operation,
            region=upstream.candidate.region,
            started=ctx.started,
            first_token_at=stream.first_token_at,
            last_token_at=upstream.last_token_at,
            prompt_tokens=last.usage.prompt_tokens,
            completion_tokens=last.usage.completion_tokens,
            attempts=upstream.attempts,
        )
        event(
            log,
            self.done_event,
            request_id=ctx.request_id,
            tenant=ctx.principal.tenant.tenant_id if ctx.principal else "",
            key_id=ctx.principal.key.key_id if ctx.principal else "",
            worker_id=upstream.candidate.worker_id,
            region=upstream.candidate.region,
            attempts=upstream.attempts,
            migrations=migrations,
            ttft_ms=round(stream.ttft_ms, 2),
            duration_ms=round((time.monotonic() - ctx.started) * 1000, 2),
            prompt_tokens=last.usage.prompt_tokens,
            completion_tokens=last.usage.completion_tokens,
            finish=FINISH_REASONS.get(last.finish_reason, "incomplete"),
            **_feature_fields(ctx.body, tool_calls),
        )


def _feature_fields(body: ChatCompletionRequest | None, tool_calls: int) -> dict[str, Any]:
    """Log fields for the chat-completions features a request used (none for plain chat)."""
    if body is None or (not body.tools and body.choices() == 1 and body.response_format is None):
        return {}
    return {
        "n": body.choices(),
        "tools": len(body.tools or ()),
        "tool_calls": tool_calls,
        "response_format": body.response_format_type(),
    }


def _route_headers(
    upstream: UpstreamStream, stream: MigratingStream | None = None
) -> dict[str, str]:
    headers = {
        "x-meridian-region": upstream.candidate.region,
        "x-meridian-worker": upstream.candidate.worker_id,
        "x-meridian-attempts": str(upstream.attempts),
    }
    if stream is not None:
        headers["x-meridian-migrations"] = str(stream.migrations)
    return headers


def _extension(stream: MigratingStream) -> dict[str, Any]:
    """The ``meridian`` extension object of the final chunk / the completion (the chat page
    reads it: services/edge/web/static/chat.js)."""
    return {
        "migrations": stream.migrations,
        "region": stream.current.candidate.region,
        "worker": stream.current.candidate.worker_id,
    }


_Migrating = Callable[[UpstreamStream], MigratingStream]


def _fingerprint(upstream: UpstreamStream) -> str:
    return f"meridian-{upstream.candidate.region}"
