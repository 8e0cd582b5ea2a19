"""The simulator's embeddings: deterministic unit vectors, a function of the input's tokens.

Each token id has a fixed pseudo-random direction (Gaussian components seeded by the id); an
input's embedding is the mean of its tokens' directions, normalised to unit length. So equal
inputs embed equally across processes and runs, inputs sharing tokens are closer than
unrelated ones (cosine similarity behaves like a bag-of-words model's), and no model is needed.
``dimensions`` below the model's size keeps the leading components and renormalises, as
Matryoshka-trained models allow.

Cost: modelled like a prefill of the input tokens (``prefill_ms_per_token``, ``time_scale``),
with no decode. The vectors themselves are pure Python (a few hundred additions per token,
~20 µs): :func:`embed_all` hands the event loop back every ``SLICE_TOKENS`` tokens, so one
call of 800 inputs of a thousand words (16 s of arithmetic) does not stop the worker from
answering probes, load reports and other streams meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from array import array
from collections.abc import Sequence

from services.common.errors import ContextLengthExceeded, InvalidRequest
from services.worker.engine import RawPrompt
from services.worker.sim.text import tokenize

#: Tokens tokenized or summed between two yields to the event loop (~10 ms of work).
SLICE_TOKENS = 512


#: Token directions kept: at the default 256 dimensions, 2 KiB each as an array of doubles,
#: so ~32 MiB in all (65,536 tuples of float objects were ~540 MiB in a worker that had seen
#: that many distinct tokens).
DIRECTIONS_CACHED = 16384


@functools.lru_cache(maxsize=DIRECTIONS_CACHED)
def _direction(token_id: int, size: int) -> array[float]:
    rng = random.Random(token_id * 1_000_003 + size)
    return array("d", [rng.gauss(0.0, 1.0) for _ in range(size)])


def token_ids(prompt: RawPrompt) -> list[int]:
    return list(prompt.token_ids) if prompt.text is None else tokenize(prompt.text)


def embed_ids(ids: Sequence[int], size: int, dimensions: int) -> tuple[float, ...]:
    """The unit vector of ``ids`` in ``size`` dimensions, truncated to ``dimensions`` (0: all)
    and renormalised."""
    total = [0.0] * size
    _add(total, ids, size)
    return _unit(total, dimensions)


def _add(total: list[float], ids: Sequence[int], size: int) -> None:
    for tid in ids:
        for i, x in enumerate(_direction(tid, size)):
            total[i] += x


def _unit(total: list[float], dimensions: int) -> tuple[float, ...]:
    if dimensions:
        total = total[:dimensions]
    norm = math.sqrt(sum(x * x for x in total)) or 1.0
    return tuple(x / norm for x in total)


async def embed_all(
    inputs: Sequence[Sequence[int]], size: int, dimensions: int
) -> tuple[tuple[float, ...], ...]:
    """:func:`embed_ids` of each input (the same vectors, summed in the same order), yielding
    to the event loop every ``SLICE_TOKENS`` tokens, within an input as between them."""
    out: list[tuple[float, ...]] = []
    for ids in inputs:
        total = [0.0] * size
        for start in range(0, len(ids), SLICE_TOKENS):
            _add(total, ids[start : start + SLICE_TOKENS], size)
            await asyncio.sleep(0)
        out.append(_unit(total, dimensions))
    return tuple(out)


async def check_inputs(
    inputs: Sequence[RawPrompt], *, max_model_len: int, size: int, dimensions: int
) -> list[list[int]]:
    """Each input's token ids; an empty or too long input is named by its index. Yields to
    the event loop between inputs once ``SLICE_TOKENS`` have been tokenized (tokenizing a
    thousand words is a millisecond or two)."""
    if dimensions < 0 or dimensions > size:
        raise InvalidRequest(
            f"dimensions must be between 1 and {size} for this model, got {dimensions}",
            param="dimensions",
        )
    out: list[list[int]] = []
    since_yield = 0
    for i, prompt in enumerate(inputs):
        ids = token_ids(prompt)
        if not ids:
            raise InvalidRequest(f"input[{i}] is empty", param=f"input[{i}]")
        if len(ids) > max_model_len:
            raise ContextLengthExceeded(
                f"input[{i}] has {len(ids)} tokens; this model embeds at most {max_model_len}",
                param=f"input[{i}]",
            )
        out.append(ids)
        since_yield += len(ids)
        if since_yield >= SLICE_TOKENS:
            since_yield = 0
            await asyncio.sleep(0)
    return out
