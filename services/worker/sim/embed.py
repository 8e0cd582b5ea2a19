"""The simulator's embeddings: deterministic unit vectors, a function of the input's tokens.

Each token id has a fixed pseudo-random direction (Gaussian components seeded by the id); an
input's embedding is the mean of its tokens' directions, normalised to unit length. So equal
inputs embed equally across processes and runs, inputs sharing tokens are closer than
unrelated ones (cosine similarity behaves like a bag-of-words model's), and no model is needed.
``dimensions`` below the model's size keeps the leading components and renormalises, as
Matryoshka-trained models allow.

Cost: modelled like a prefill of the input tokens (``prefill_ms_per_token``, ``time_scale``),
with no decode.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence

from services.common.errors import ContextLengthExceeded, InvalidRequest
from services.worker.engine import RawPrompt
from services.worker.sim.text import tokenize


@functools.lru_cache(maxsize=65536)
def _direction(token_id: int, size: int) -> tuple[float, ...]:
    rng = random.Random(token_id * 1_000_003 + size)
    return tuple(rng.gauss(0.0, 1.0) for _ in range(size))


def token_ids(prompt: RawPrompt) -> list[int]:
    return list(prompt.token_ids) if prompt.text is None else tokenize(prompt.text)


def embed_ids(ids: Sequence[int], size: int, dimensions: int) -> tuple[float, ...]:
    """The unit vector of ``ids`` in ``size`` dimensions, truncated to ``dimensions`` (0: all)
    and renormalised."""
    total = [0.0] * size
    for tid in ids:
        for i, x in enumerate(_direction(tid, size)):
            total[i] += x
    if dimensions:
        total = total[:dimensions]
    norm = math.sqrt(sum(x * x for x in total)) or 1.0
    return tuple(x / norm for x in total)


def check_inputs(
    inputs: Sequence[RawPrompt], *, max_model_len: int, size: int, dimensions: int
) -> list[list[int]]:
    """Each input's token ids; an empty or too long input is named by its index."""
    if dimensions < 0 or dimensions > size:
        raise InvalidRequest(
            f"dimensions must be between 1 and {size} for this model, got {dimensions}",
            param="dimensions",
        )
    out: list[list[int]] = []
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
    return out
