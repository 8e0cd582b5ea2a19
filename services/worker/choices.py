"""``n`` > 1: one Generate call, several choices, each its own engine request.

Why here and not in each engine: both engines already stream one sequence per request with
abort, so *n* choices are *n* requests (ids ``<id>#<i>``, and with a seed, seed + i so that
seeded choices differ as OpenAI's do) whose outputs are interleaved in arrival order, each
tagged with its choice index. The shared prompt is prefilled once per choice, but on vLLM the
prefix cache serves the later ones. For n == 1 the engine's stream is passed through unchanged.

Usage for the client is the request's: the prompt once, completion tokens summed over the
choices (:class:`UsageTotals`).

Cancelling the consumer (or closing it) cancels every choice's task, which aborts each engine
request (the engine contract); a choice that fails fails the whole call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator

from services.worker.engine import Engine, EngineOutput, EngineRequest


def choice_requests(request: EngineRequest, n: int) -> list[EngineRequest]:
    """The engine requests of ``n`` choices (``[request]`` itself when n == 1)."""
    if n <= 1:
        return [request]
    seed = request.sampling.seed
    return [
        dataclasses.replace(
            request,
            request_id=f"{request.request_id}#{i}",
            sampling=dataclasses.replace(
                request.sampling, seed=None if seed is None else _wrap_seed(seed + i)
            ),
        )
        for i in range(n)
    ]


def _wrap_seed(seed: int) -> int:
    return seed if seed < 2**63 else seed - 2**64


async def interleave(
    engine: Engine, requests: list[EngineRequest]
) -> AsyncGenerator[tuple[int, EngineOutput], None]:
    """``(choice index, output)`` of every request, in the order outputs arrive."""
    if len(requests) == 1:
        async with contextlib.aclosing(engine.generate(requests[0])) as outputs:
            async for out in outputs:
                yield 0, out
        return
    queue: asyncio.Queue[tuple[int, EngineOutput | BaseException | None]] = asyncio.Queue(
        maxsize=4 * len(requests)
    )

    async def pump(index: int, request: EngineRequest) -> None:
        try:
            async with contextlib.aclosing(engine.generate(request)) as outputs:
                async for out in outputs:
                    await queue.put((index, out))
        except Exception as err:  # noqa: BLE001 -- handed to the consumer, which raises it
            await queue.put((index, err))
            return
        await queue.put((index, None))

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(requests)]
    remaining = len(requests)
    try:
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclasses.dataclass(slots=True)
class UsageTotals:
    """Cumulative usage over choices: the prompt counted once, completions summed."""

    choices: int
    prompt: int = 0
    cached: int = 0
    _completion: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self._completion = [0] * self.choices

    def add(self, index: int, out: EngineOutput) -> None:
        self.prompt = max(self.prompt, out.prompt_tokens)
        self.cached = max(self.cached, out.cached_prompt_tokens)
        self._completion[index] = out.completion_tokens

    @property
    def completion(self) -> int:
        return sum(self._completion)
