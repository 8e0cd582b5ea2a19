"""The edge's request pipeline for chat completions: an ordered chain of stages.

Like Envoy's HTTP filter chain: each stage either answers the request itself (by raising a
:class:`~services.common.errors.MeridianError`, rendered in OpenAI's error format) or passes
the context on to the next stage; the last stage is terminal and writes the response.

The order is declared once, here (:data:`CHAT_STAGE_ORDER`), and pinned by a test.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from aiohttp import web

from services.edge.context import ChatContext

Next = Callable[[ChatContext], Awaitable[web.StreamResponse]]

#: Written once; ``build_chain`` refuses any other order.
CHAT_STAGE_ORDER: tuple[str, ...] = (
    "connection_guard",
    "authenticate",
    "validate",
    "admit",
    "route",
    "stream",
)


class Stage(Protocol):
    name: str

    async def __call__(self, ctx: ChatContext, call_next: Next) -> web.StreamResponse: ...


class TerminalStage(Protocol):
    name: str

    async def __call__(self, ctx: ChatContext) -> web.StreamResponse: ...


def build_chain(stages: Sequence[Stage], terminal: TerminalStage) -> Next:
    """Compose ``stages`` (outermost first) around ``terminal``.

    Stages must appear in :data:`CHAT_STAGE_ORDER`'s order; optional stages may be left out.
    """
    names = [s.name for s in stages] + [terminal.name]
    unknown = [n for n in names if n not in CHAT_STAGE_ORDER]
    if unknown:
        raise ValueError(f"unknown pipeline stages: {unknown}")
    positions = [CHAT_STAGE_ORDER.index(n) for n in names]
    if positions != sorted(positions) or len(set(names)) != len(names):
        raise ValueError(f"pipeline stages out of order: {names}; expected {CHAT_STAGE_ORDER}")
    if terminal.name != CHAT_STAGE_ORDER[-1]:
        raise ValueError(f"the terminal stage must be {CHAT_STAGE_ORDER[-1]!r}")

    handler: Next = terminal.__call__
    for stage in reversed(stages):
        handler = _bind(stage, handler)
    return handler


def _bind(stage: Stage, call_next: Next) -> Next:
    async def run(ctx: ChatContext) -> web.StreamResponse:
        return await stage(ctx, call_next)

    return run
