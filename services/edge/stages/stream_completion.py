"""The ``stream`` stage of POST /v1/completions, terminal: one token stream per choice (``n``
per prompt; choice *j* of prompt *i* has ``index`` i·n + j, as OpenAI and vLLM number them),
opened with failover like chat's, answered as one ``text_completion`` or as SSE chunks
interleaved as the choices' tokens arrive, then ``[DONE]``.

It is the chat stream stage (:class:`~services.edge.stages.stream.Stream`) with the
endpoint's own request and rendering: keep-alives before a slow first token, bounded writes,
client disconnect cancelling every worker call, errors after the headers as an SSE error
payload, the drain deadline's cut (an SSE error event, or a 503) — all inherited. Usage is
summed over the choices (a prompt's tokens once per prompt, however many choices it has, as
OpenAI counts them), and ``ctx.tokens_used`` follows it, so the admit stage settles the
reservation with what was really used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web

from meridian.v1 import worker_pb2
from services.common.errors import MeridianError, Unavailable
from services.common.logs import event
from services.edge.context import ChatContext
from services.edge.guard import cut_scope
from services.edge.httperrors import Interrupted
from services.edge.offload import answer_items, json_answer
from services.edge.openai_completions import CompletionRequest
from services.edge.openai_types import now_s
from services.edge.render import FINISH_REASONS, SSE_DONE
from services.edge.render_completion import (
    CompletionChunkRenderer,
    LogprobsBuilder,
    choice,
    completion_body,
)
from services.edge.stages.stream import (
    ClientGone,
    Stream,
    _fingerprint,
    _route_headers,
    chat_sse_ending,
)
from services.edge.upstream import protos
from services.edge.upstream.failover import UpstreamStream, open_stream

log = logging.getLogger("meridian.edge")


class _Choice:
    """One prompt's stream as it is read: text, logprobs, last chunk."""

    def __init__(
        self,
        index: int,
        upstream: UpstreamStream,
        logprobs: bool,
        *,
        echo_only: bool = False,
        first_of_prompt: bool = True,
    ) -> None:
        self.index = index
        self.first_of_prompt = first_of_prompt  # its prompt's tokens count in usage
        self.upstream = upstream
        self.last = upstream.first
        self.text: list[str] = []
        self.logprobs = LogprobsBuilder() if logprobs else None
        self.echo_only = echo_only

    def take(self, chunk: worker_pb2.GenerateChunk) -> tuple[str, dict[str, object] | None]:
        """This chunk's text (the echoed prompt first) and logprobs delta. A stream the worker
        hands back unfinished (its drain ended) is an error here: completions streams are not
        migrated (only chat's are, services/edge/migration/)."""
        if chunk.finish_reason == worker_pb2.FINISH_REASON_ABORT:
            raise Unavailable("the worker stopped before this completion finished")
        if self.echo_only:
            # max_tokens 0: the one token the worker was asked for is not the client's, nor
            # in its usage (as OpenAI reports it); the prompt and its logprobs are.
            del chunk.logprobs[:]
            chunk.text = ""
            chunk.usage.completion_tokens = 0
        self.last = chunk
        text = chunk.prompt_text + chunk.text
        self.text.append(text)
        if self.logprobs is None:
            return text, None
        if chunk.prompt_logprobs:
            self.logprobs.add(chunk.prompt_logprobs, prompt=True)
        elif chunk.prompt_text:
            self.logprobs.skip_text(chunk.prompt_text)
        self.logprobs.add(chunk.logprobs)
        return text, self.logprobs.delta()

    def reported(self) -> worker_pb2.GenerateChunk:
        """The last chunk as this choice's metrics and log line count it: a prompt's tokens
        once, on its first choice (as its usage does), not once per choice."""
        if self.first_of_prompt:
            return self.last
        chunk = worker_pb2.GenerateChunk()
        chunk.CopyFrom(self.last)
        chunk.usage.prompt_tokens = 0
        chunk.usage.cached_prompt_tokens = 0
        return chunk

    def finish(self) -> str:
        if self.echo_only:
            return "length"  # max_tokens (0) reached, as OpenAI says
        return FINISH_REASONS.get(self.last.finish_reason, "stop")


def _summed(choices: list[_Choice]) -> worker_pb2.Usage:
    usage = worker_pb2.Usage()
    for c in choices:
        if c.first_of_prompt:
            usage.prompt_tokens += c.last.usage.prompt_tokens
            usage.cached_prompt_tokens += c.last.usage.cached_prompt_tokens
        usage.completion_tokens += c.last.usage.completion_tokens
    return usage


def _choices(body: CompletionRequest, upstreams: list[UpstreamStream]) -> list[_Choice]:
    """The choices in index order (``upstreams`` are opened in that order)."""
    n = body.choices()
    return [
        _Choice(
            i,
            u,
            body.logprobs is not None,
            echo_only=body.echo_only,
            first_of_prompt=i % n == 0,
        )
        for i, u in enumerate(upstreams)
    ]


class CompletionStream(Stream):
    """The terminal stage of POST /v1/completions (see the module docstring)."""

    done_event = "completion.completed"
    operation = "text_completion"

    async def __call__(self, ctx: ChatContext) -> web.StreamResponse:
        body = ctx.completion
        assert body is not None and ctx.route is not None and ctx.reroute is not None
        n = body.choices()
        single = len(ctx.prompts) * n == 1
        openings = [
            asyncio.ensure_future(self._open(ctx, i * n + j, p, choice=j, single=single))
            for i, p in enumerate(ctx.prompts)
            for j in range(n)
        ]
        try:
            if body.stream:
                return await self._stream_all(ctx, body, openings)
            async with cut_scope(ctx.in_flight):  # cut at the drain deadline: a 503
                return await self._complete_all(ctx, body, openings)
        except asyncio.CancelledError:
            self._counters.client_disconnects += 1
            raise
        finally:
            for opening in openings:
                if not opening.done():
                    opening.cancel()
                    with contextlib.suppress(asyncio.CancelledError, MeridianError):
                        await opening
                elif not opening.cancelled() and opening.exception() is None:
                    opening.result().cancel()

    def _open(
        self, ctx: ChatContext, index: int, prompt: str | list[int], *, choice: int, single: bool
    ) -> asyncio.Future[UpstreamStream]:
        assert ctx.route is not None and ctx.reroute is not None
        base = ctx.request_id if single else f"{ctx.request_id}-{index}"

        def generate(request_id: str, decision_id: str) -> worker_pb2.GenerateRequest:
            return protos.completion_request(
                ctx, prompt, request_id=request_id, decision_id=decision_id, choice=choice
            )

        return asyncio.ensure_future(
            open_stream(
                first_route=ctx.route,
                reroute=ctx.reroute,
                outcomes=self._router,
                workers=self._workers,
                request_id=base,
                generate=generate,
                policy=self._policy,
                tracer=self._telemetry.tracer,
            )
        )

    def _track(self, ctx: ChatContext, choices: list[_Choice]) -> None:
        usage = _summed(choices)
        ctx.tokens_used = usage.prompt_tokens + usage.completion_tokens

    async def _complete_all(
        self,
        ctx: ChatContext,
        body: CompletionRequest,
        openings: list[asyncio.Future[UpstreamStream]],
    ) -> web.StreamResponse:
        upstreams = await asyncio.gather(*openings)
        choices = _choices(body, list(upstreams))

        async def read(c: _Choice) -> None:
            async for chunk in c.upstream.chunks():
                c.take(chunk)
                self._track(ctx, choices)

        await asyncio.gather(*(read(c) for c in choices))
        for c in choices:
            self._log_done(ctx, c.upstream, c.reported())
        self._counters.completions += 1
        created, usage = now_s(), _summed(choices)
        return await json_answer(
            lambda: completion_body(
                completion_id=ctx.request_id,
                model=body.model,
                created=created,
                fingerprint=_fingerprint(upstreams[0]),
                choices=[
                    choice(
                        index=c.index,
                        text="".join(c.text),
                        logprobs=c.logprobs.as_dict() if c.logprobs is not None else None,
                        finish=c.finish(),
                    )
                    for c in choices
                ],
                usage=usage,
            ),
            items=answer_items(
                usage.completion_tokens + (usage.prompt_tokens if body.echo else 0),
                logprobs=body.logprobs is not None,
                top_logprobs=body.logprobs or 0,
            ),
            headers={**ctx.headers, **_route_headers(upstreams[0])},
        )

    async def _stream_all(
        self,
        ctx: ChatContext,
        body: CompletionRequest,
        openings: list[asyncio.Future[UpstreamStream]],
    ) -> web.StreamResponse:
        all_open = asyncio.ensure_future(asyncio.gather(*openings))
        try:
            opened = await self._open_sse(ctx, all_open, lambda ups: _route_headers(ups[0]))
        finally:
            if not all_open.done():
                all_open.cancel()
        if isinstance(opened, web.StreamResponse):
            return opened  # it ended before every choice's first token
        resp, upstreams = opened
        render = CompletionChunkRenderer(
            completion_id=ctx.request_id,
            model=body.model,
            created=now_s(),
            fingerprint=_fingerprint(upstreams[0]),
            usage=body.include_usage(),
        )
        choices = _choices(body, list(upstreams))
        queue: asyncio.Queue[tuple[_Choice, worker_pb2.GenerateChunk | MeridianError]] = (
            asyncio.Queue()
        )

        async def pump(c: _Choice) -> None:
            try:
                async for chunk in c.upstream.chunks():
                    await queue.put((c, chunk))
            except MeridianError as err:
                await queue.put((c, err))

        pumps = [asyncio.ensure_future(pump(c)) for c in choices]
        open_choices = len(choices)
        try:
            async with cut_scope(ctx.in_flight):
                while open_choices:
                    c, item = await queue.get()
                    if isinstance(item, MeridianError):
                        raise item
                    text, lps = c.take(item)
                    self._track(ctx, choices)
                    finished = item.finish_reason != worker_pb2.FINISH_REASON_UNSPECIFIED
                    if text or (lps and lps["tokens"]):
                        await self._write(
                            ctx,
                            resp,
                            render.chunk(index=c.index, text=text, logprobs=lps, finish=None),
                        )
                    if finished:
                        open_choices -= 1
                        await self._write(
                            ctx,
                            resp,
                            render.chunk(index=c.index, text="", logprobs=None, finish=c.finish()),
                        )
                if body.include_usage():
                    await self._write(ctx, resp, render.usage(_summed(choices)))
                await self._write(ctx, resp, SSE_DONE)
                self._counters.completions += 1
        except Interrupted as err:
            for c in choices:
                c.upstream.cancel()  # the workers stop now, not after the last write
            await self._end_cut(ctx, resp, err)
        except MeridianError as err:
            self._counters.stream_errors += 1
            event(
                log,
                "stream.failed",
                level=logging.WARNING,
                request_id=ctx.request_id,
                error=err.message,
            )
            with contextlib.suppress(ClientGone):
                await self._write(ctx, resp, chat_sse_ending(err))
        except ClientGone:
            pass
        finally:
            for p in pumps:
                p.cancel()
            for c in choices:
                c.upstream.cancel()
                self._log_done(ctx, c.upstream, c.reported())
        return resp
