"""CPU work too big for the event loop: one thread, and JSON encoded in pieces.

One edge process is one event loop: a request that makes it compute for a second stops every
other stream of the process for that second. Parsing a body of megabytes of tool schemas
(stages/validate.py), building and encoding a non-streaming answer of sixteen choices with
twenty logprobs per token (a 40 MB JSON document, seconds of Python) — these run here instead.

In the thread, the loop still gets the interpreter every few milliseconds — except during a
single C call, which holds it throughout: ``json.dumps`` of 40 MB is one such call of ~2 s.
:func:`json_bytes` therefore encodes long lists a slice at a time (each slice one short C
call), so the longest hold is one slice's, not the document's.

One thread: large requests queue behind each other, never ahead of everyone else's.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")

_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-offload")
#: JSON bigger than this is parsed, checked or encoded here rather than on the loop (a few
#: hundred microseconds of work on the loop is cheaper than the hop to the thread and back).
OFF_LOOP_BYTES = 64 * 1024
#: Items of a list encoded by one ``json.dumps`` call (~10 ms for 256 logprob entries).
SLICE = 256
#: How deep :func:`json_bytes` looks for long lists (an answer's are at most 4 levels down:
#: ``choices[i].logprobs.content``, ``data[i].embedding``).
_DEPTH = 5


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the offload thread (with this task's context: its span, its logs)."""
    run = contextvars.copy_context().run
    return await asyncio.get_running_loop().run_in_executor(_THREAD, run, fn, *args)


def json_bytes(value: Any) -> bytes:
    """``json.dumps(value)`` as UTF-8, byte for byte, long lists encoded a slice at a time."""
    return "".join(_pieces(value, _DEPTH)).encode()


def _pieces(value: Any, depth: int) -> Iterator[str]:
    if depth == 0 or not isinstance(value, dict | list):
        yield json.dumps(value)
    elif isinstance(value, dict):
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            yield (", " if i else "") + json.dumps(str(key)) + ": "
            yield from _pieces(item, depth - 1)
        yield "}"
    elif len(value) > SLICE:
        # A long list (a choice's logprobs, an embedding, the embeddings of a batch): its
        # items are small, a slice of them is one short C call.
        yield "["
        for start in range(0, len(value), SLICE):
            part = json.dumps(value[start : start + SLICE])
            yield (", " if start else "") + part[1:-1]
        yield "]"
    else:
        yield "["
        for i, item in enumerate(value):
            if i:
                yield ", "
            yield from _pieces(item, depth - 1)
        yield "]"


#: An answer of this many tokens, logprob alternatives or floats (~0.5 MB of JSON, ~25 ms
#: to build and encode) or more is built off the loop; smaller ones are not worth a thread hop.
LARGE_ANSWER_ITEMS = 8192


def answer_items(tokens: int, *, logprobs: bool, top_logprobs: int) -> int:
    """How many items a completion's answer holds: its tokens, and with logprobs each token's
    entry and its alternatives."""
    return tokens * (1 + (1 + top_logprobs if logprobs else 0))


async def json_answer(
    build: Callable[[], Any], *, items: int, headers: dict[str, str]
) -> web.Response:
    """The JSON response ``build()`` makes; built and encoded off the loop when it holds
    ``items`` (see :func:`answer_items`) of at least ``LARGE_ANSWER_ITEMS``."""
    if items < LARGE_ANSWER_ITEMS:
        return web.json_response(build(), headers=headers)
    body = await off_loop(lambda: json_bytes(build()))
    return web.Response(body=body, content_type="application/json", headers=headers)
