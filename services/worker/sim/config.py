"""``SimConfig``: the knobs of the simulated GPU server, validated once, frozen.

The cost model (see :mod:`services.worker.sim.scheduler`) charges one engine step

    step_ms = (decode_base_ms
               + decode_ms_per_seq * sequences_in_batch
               + prefill_ms_per_token * prompt_tokens_computed) * time_scale

The defaults look like one small GPU serving an ~8B model with vLLM: about 50k prompt tokens/s
of prefill, a 6 ms decode step for one sequence and ~15.6 ms for a full batch of 64 (about
4,100 generated tokens/s), 32k tokens of KV cache in blocks of 16 and an 8k context.

``time_scale`` multiplies every modelled duration (step costs and the load delay): 0.01 runs the
same server 100 times faster, which keeps async tests short without changing any behaviour
other than speed.

Configuration read from YAML or a command line goes through :meth:`SimConfig.from_mapping`, whose
errors (:class:`SimConfigError`) name the offending key.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class SimConfigError(ValueError):
    """A bad simulator setting; ``key`` names it (as written in the config mapping)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"sim config {key!r}: {message}")
        self.key = key


#: The largest simulated embedding: the worker keeps up to 16,384 token directions
#: (``sim/embed.py``), 8 bytes per dimension each — 512 MiB at this size, 32 MiB at the
#: default 256. Real embedding models stop near here too (4,096 for the largest in common use).
MAX_EMBEDDING_DIMENSIONS = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """Settings of one simulated inference server (all durations in milliseconds or seconds of
    *modelled* time, before ``time_scale``)."""

    models: tuple[str, ...] = ("meridian-sim",)
    """Served model names. They are aliases of one model: they share the batch and KV cache."""
    max_model_len: int = 8192
    """Context length in tokens (prompt + completion)."""
    max_num_seqs: int = 64
    """Most sequences in the running batch."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step: one per decoding sequence plus prompt tokens being prefilled."""
    chunked_prefill: bool = True
    """Split a prompt longer than the step's remaining budget over several steps. When off, a
    prompt is admitted only if it fits the budget whole (the budget must then cover
    ``max_model_len``)."""
    kv_cache_tokens: int = 32768
    """KV-cache capacity in tokens (rounded down to whole blocks)."""
    block_size: int = 16
    """Tokens per KV block: the unit of allocation and of prefix caching."""
    enable_prefix_caching: bool = True
    """Share KV blocks of identical prompt prefixes between requests (vLLM's automatic prefix
    caching): a hit skips prefill for the cached tokens."""
    prefill_ms_per_token: float = 0.02
    decode_base_ms: float = 6.0
    """Fixed cost of one forward pass (kernel launches, weights read once per step)."""
    decode_ms_per_seq: float = 0.15
    """Added cost of each sequence in the batch (attention, sampling)."""
    output_len_min: int = 32
    output_len_max: int = 384
    """A request's natural length (where the model would emit end-of-sequence) is drawn
    uniformly from ``[output_len_min, output_len_max]`` by its seed, unless ``ignore_eos``."""
    max_waiting: int | None = None
    """Admission queue limit; a request beyond it is refused with ``Overloaded``. None: no limit
    (vLLM's behaviour; admission control is then the edge's and router's job)."""
    load_delay_s: float = 0.0
    """Modelled time ``start()`` takes (the model reports LOADING meanwhile)."""
    time_scale: float = 1.0
    """Multiplies every modelled duration: 0.01 runs 100 times faster than the model says."""
    stats_window_s: float = 5.0
    """Window of ``tokens_per_second``, ``prefix_cache_hit_rate`` and GPU utilization (clock
    seconds)."""
    gpu_memory_utilization: float = 0.9
    """The simulated GPU's memory in use, as a fraction: vLLM reserves this share up front for
    weights and KV cache, so it does not move with load (KV use is reported separately)."""
    completions: bool = True
    """Serve POST /v1/completions (raw prompts, echo) as well as chat."""
    embeddings: bool = True
    """Serve POST /v1/embeddings: deterministic unit vectors (see ``sim/embed.py``)."""
    embedding_dimensions: int = 256
    """Size of the simulated embeddings; ``dimensions`` may ask for fewer (Matryoshka-style).
    At most :data:`MAX_EMBEDDING_DIMENSIONS`: the token directions kept grow with it."""

    def __post_init__(self) -> None:
        if not self.models:
            raise SimConfigError("models", "at least one served model name is required")
        for name in self.models:
            if not isinstance(name, str) or not name.strip():
                raise SimConfigError("models", f"model names must be non-empty strings: {name!r}")
        if len(set(self.models)) != len(self.models):
            raise SimConfigError("models", "model names must be unique")
        for key in (
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "kv_cache_tokens",
            "block_size",
            "output_len_min",
            "embedding_dimensions",
        ):
            _require_int(key, getattr(self, key), minimum=1)
        _require_int("output_len_max", self.output_len_max, minimum=self.output_len_min)
        if self.embedding_dimensions > MAX_EMBEDDING_DIMENSIONS:
            raise SimConfigError(
                "embedding_dimensions",
                f"must be <= {MAX_EMBEDDING_DIMENSIONS}, got {self.embedding_dimensions}",
            )
        if self.max_waiting is not None:
            _require_int("max_waiting", self.max_waiting, minimum=0)
        for key in ("prefill_ms_per_token", "decode_ms_per_seq", "load_delay_s"):
            _require_float(key, getattr(self, key), positive=False)
        for key in ("decode_base_ms", "time_scale", "stats_window_s"):
            _require_float(key, getattr(self, key), positive=True)
        _require_float("gpu_memory_utilization", self.gpu_memory_utilization, positive=True)
        if self.gpu_memory_utilization > 1:
            raise SimConfigError(
                "gpu_memory_utilization", f"must be <= 1, got {self.gpu_memory_utilization}"
            )
        for key in ("chunked_prefill", "enable_prefix_caching", "completions", "embeddings"):
            if not isinstance(getattr(self, key), bool):
                raise SimConfigError(key, f"must be true or false, got {getattr(self, key)!r}")
        if self.kv_cache_tokens < self.block_size:
            raise SimConfigError("kv_cache_tokens", "must hold at least one block")
        if self.num_kv_blocks * self.block_size < self.max_model_len:
            # Otherwise one request alone could outgrow the cache and be preempted forever.
            raise SimConfigError(
                "kv_cache_tokens",
                f"the KV cache ({self.num_kv_blocks * self.block_size} tokens in whole blocks) "
                f"must hold one full context (max_model_len={self.max_model_len})",
            )
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise SimConfigError(
                "max_num_batched_tokens",
                "without chunked_prefill the step budget must cover max_model_len "
                f"({self.max_model_len}), or a long prompt could never be scheduled",
            )

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> SimConfig:
        """Build from a plain mapping (parsed YAML, CLI flags). Unknown keys, wrong types and
        out-of-range values raise :class:`SimConfigError` naming the key."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if key not in fields:
                known = ", ".join(sorted(fields))
                raise SimConfigError(str(key), f"unknown setting (known: {known})")
            kwargs[key] = _coerce(key, fields[key].type, value)
        return cls(**kwargs)


def _coerce(key: str, annotation: object, value: Any) -> Any:
    """Check a mapping value against the field's annotation (a string, as ``from __future__
    import annotations`` leaves it); ints are accepted where floats are expected."""
    kind = str(annotation)
    if kind == "tuple[str, ...]":
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise SimConfigError(key, f"must be a list of strings, got {value!r}")
    if kind == "bool":
        if not isinstance(value, bool):
            raise SimConfigError(key, f"must be true or false, got {value!r}")
        return value
    if kind in ("int", "int | None"):
        if value is None and kind == "int | None":
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise SimConfigError(key, f"must be an integer, got {value!r}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SimConfigError(key, f"must be a number, got {value!r}")
        return float(value)
    raise AssertionError(f"SimConfig field {key} has an unhandled type {kind}")


def _require_int(key: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SimConfigError(key, f"must be an integer, got {value!r}")
    if value < minimum:
        raise SimConfigError(key, f"must be >= {minimum}, got {value}")


def _require_float(key: str, value: object, *, positive: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SimConfigError(key, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise SimConfigError(key, f"must be finite, got {value}")
    if positive and value <= 0:
        raise SimConfigError(key, f"must be > 0, got {value}")
    if not positive and value < 0:
        raise SimConfigError(key, f"must be >= 0, got {value}")
