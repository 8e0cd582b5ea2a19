"""The edge's whole request order, declared once: the middlewares every route passes, then
each API endpoint's pipeline of stages.

    telemetry → error_boundary → ip_guard            (every route; MIDDLEWARE_ORDER)
      → connection_guard → authenticate → validate → admit → route → stream
                                           (POST /v1/chat/completions; CHAT_STAGE_ORDER)
                                           (POST /v1/completions; COMPLETIONS_STAGE_ORDER)
                                           (POST /v1/responses; RESPONSES_STAGE_ORDER)
      → connection_guard → authenticate → validate → admit → route → embed
                                           (POST /v1/embeddings; EMBEDDINGS_STAGE_ORDER)

The endpoints share their stages; what differs is the endpoint's *dialect*
(services/edge/dialects/: how validate parses the body, what admit reserves, what route asks)
and its terminal stage (how the answer is rendered).

Like Envoy's HTTP filter chain: each stage either answers the request itself (by raising a
:class:`~services.common.errors.MeridianError`, rendered in OpenAI's error format by the error
boundary) or passes the context on to the next stage; the last stage is terminal and writes
the response. Why the middlewares are in this order: telemetry is outermost so it records the
status the client really gets; the error boundary is next, so every refusal raised inside it
(the IP guard's 429 included) becomes an OpenAI error rather than a 500; the IP guard is
innermost of the three, in front of everything that touches Redis.

``build_chain`` and ``ordered_middlewares`` refuse any other order;
tests/unit/edge/test_edge_order.py pins both, by name and by behaviour.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from services.edge.context import ChatContext

Next = Callable[[ChatContext], Awaitable[web.StreamResponse]]

#: aiohttp middlewares, outermost first; ``ordered_middlewares`` refuses any other order.
MIDDLEWARE_ORDER: tuple[str, ...] = ("telemetry", "error_boundary", "ip_guard")

#: Written once; ``build_chain`` refuses any other order.
CHAT_STAGE_ORDER: tuple[str, ...] = (
    "connection_guard",
    "authenticate",
    "validate",
    "admit",
    "route",
    "stream",
)


#: Completions pass chat's stages; the dialect and the stream stage's rendering differ.
COMPLETIONS_STAGE_ORDER: tuple[str, ...] = CHAT_STAGE_ORDER

#: Responses pass chat's stages too: the dialect translates the request into chat's, the
#: stream stage renders a ``response`` and its typed events.
RESPONSES_STAGE_ORDER: tuple[str, ...] = CHAT_STAGE_ORDER

#: Embeddings: the same stages up to route; the terminal makes one unary Embed call.
EMBEDDINGS_STAGE_ORDER: tuple[str, ...] = (*CHAT_STAGE_ORDER[:-1], "embed")

#: The declared order of every API endpoint's pipeline, by dialect name.
STAGE_ORDERS: dict[str, tuple[str, ...]] = {
    "chat": CHAT_STAGE_ORDER,
    "completions": COMPLETIONS_STAGE_ORDER,
    "responses": RESPONSES_STAGE_ORDER,
    "embeddings": EMBEDDINGS_STAGE_ORDER,
}

#: Everything a chat request passes through, outermost first.
EDGE_ORDER: tuple[str, ...] = (*MIDDLEWARE_ORDER, *CHAT_STAGE_ORDER)


def ordered_middlewares(named: Mapping[str, Middleware]) -> list[Middleware]:
    """The middlewares in :data:`MIDDLEWARE_ORDER`; every one must be given, no other."""
    if set(named) != set(MIDDLEWARE_ORDER):
        missing = [n for n in MIDDLEWARE_ORDER if n not in named]
        unknown = [n for n in named if n not in MIDDLEWARE_ORDER]
        raise ValueError(f"middlewares: missing {missing}, unknown {unknown}")
    return [named[n] for n in MIDDLEWARE_ORDER]


class Stage(Protocol):
    name: str

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse: ...


class TerminalStage(Protocol):
    name: str

    async def __call__(self, ctx: ChatContext) -> web.StreamResponse: ...


#: Stages that get their own span: the ones that wait on something (Redis, the router).
#: The others are pure CPU measured in microseconds; a span each would cost more than they do
#: (bench/telemetry_overhead.py), and their time shows as the gaps between these spans.
TRACED_STAGES: frozenset[str] = frozenset({"authenticate", "admit", "route"})


def build_chain(
    stages: Sequence[Stage],
    terminal: TerminalStage,
    *,
    tracer: trace.Tracer | None = None,
    traced: frozenset[str] = TRACED_STAGES,
    order: tuple[str, ...] = CHAT_STAGE_ORDER,
) -> Next:
    """Compose ``stages`` (outermost first) around ``terminal``.

    Stages must appear in ``order`` (an endpoint's declared order, :data:`STAGE_ORDERS`;
    chat's by default); optional stages may be left out.
    With a ``tracer``, each stage named in ``traced`` gets a span ``edge.<name>`` covering its
    *own* work: the span ends when the stage hands over to the next one, and the next stage's
    span is a sibling under the request's span (not nested ever deeper), so a trace reads as the
    pipeline does. The terminal stage's attempts have spans of their own (edge.attempt).
    """
    names = [s.name for s in stages] + [terminal.name]
    unknown = [n for n in names if n not in order]
    if unknown:
        raise ValueError(f"unknown pipeline stages: {unknown}")
    positions = [order.index(n) for n in names]
    if positions != sorted(positions) or len(set(names)) != len(names):
        raise ValueError(f"pipeline stages out of order: {names}; expected {order}")
    if terminal.name != order[-1]:
        raise ValueError(f"the terminal stage must be {order[-1]!r}")

    tracing = tracer is not None and not isinstance(tracer, trace.NoOpTracer)
    handler: Next = terminal.__call__
    for stage in reversed(stages):
        if tracing and stage.name in traced:
            assert tracer is not None
            handler = _bind_traced(stage, handler, tracer)
        else:
            handler = _bind(stage, handler)
    return handler


def _bind(stage: Stage, call_next: Next) -> Next:
    async def run(ctx: ChatContext) -> web.StreamResponse:
        return await stage(ctx, call_next)

    return run


def _bind_traced(stage: Stage, call_next: Next, tracer: trace.Tracer) -> Next:
    span_name = f"edge.{stage.name}"

    async def run(ctx: ChatContext) -> web.StreamResponse:
        parent = otel_context.get_current()
        if not trace.get_current_span(parent).is_recording():
            # The request is not sampled: its stage spans would be dropped anyway, so skip
            # creating them and switching contexts. This is what keeps ratio sampling cheap.
            return await stage(ctx, call_next)
        span = tracer.start_span(span_name, context=parent)
        handed_over = False

        async def next_stage(ctx2: ChatContext) -> web.StreamResponse:
            nonlocal handed_over
            handed_over = True
            span.end()
            token = otel_context.attach(parent)
            try:
                return await call_next(ctx2)
            finally:
                otel_context.detach(token)

        # The stage's span is current while the stage runs (attach/detach rather than
        # ``trace.use_span``: same effect, without a generator-based context manager per stage).
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            return await stage(ctx, next_stage)
        except BaseException as exc:
            if not handed_over:
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                span.set_attribute("error.type", type(exc).__name__)
            raise
        finally:
            otel_context.detach(token)
            if not handed_over:
                span.end()

    return run
