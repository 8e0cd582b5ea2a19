"""vLLM's environment variables, read once instead of on every engine output.

``vllm.envs`` evaluates a variable (an ``os.getenv`` and its parsing) on each attribute read,
and vLLM's frontend reads some of them per request per engine step (``IterationStats``, the
Prometheus logger: ``VLLM_COMPUTE_NANS_IN_LOGITS``). vLLM caches them with
``enable_envs_cache()`` — but only in its engine-core and executor processes, after they
start, because a variable changed later would go unseen. The worker's frontend sets its
``VLLM_*`` variables while the engine starts and never afterwards, so it caches them once the
engine is ready (:func:`cache_vllm_env`), and any variable it sets goes through
:func:`set_vllm_env`, which takes a new snapshot when the cache is on (a test process starts
several engines, and a later one may set what an earlier one cached).
"""

from __future__ import annotations

import os

from vllm import envs


def cache_vllm_env() -> None:
    """Snapshot every vLLM variable now; later reads return the snapshot."""
    envs.disable_envs_cache()
    envs.enable_envs_cache()


def set_vllm_env(name: str, value: str) -> None:
    """Set ``name`` for vLLM, and let a cached snapshot see it."""
    os.environ[name] = value
    if envs._is_envs_cache_enabled():
        cache_vllm_env()
