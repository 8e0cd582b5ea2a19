"""``--engine vllm``: the worker's command line → a :class:`VllmEngine`.

Flags are checked (:class:`VllmConfig` validates them) *before* vllm is imported: a typo costs
milliseconds, not the seconds of a 3.5 GB import.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from services.worker.engine import Engine, EngineConfigError
from services.worker.vllm.config import VllmConfig


def _check_local_model(model: str) -> None:
    """A ``--model`` written as a path must be a model folder. vLLM would otherwise take it
    for a Hugging Face name and fail minutes later with "Repo id must use alphanumeric
    chars" (or try to download it). Names like ``org/model`` are left to vLLM."""
    if not model.startswith(("/", "./", "../", "~")):
        return
    folder = Path(model).expanduser()
    if not folder.is_dir():
        raise EngineConfigError(f"--model {model}: no such model folder")
    if not (folder / "config.json").is_file():
        raise EngineConfigError(f"--model {model}: not a model folder (no config.json in it)")


def from_args(args: argparse.Namespace) -> Engine:
    if not args.model:
        raise EngineConfigError("--model is required with --engine vllm (a folder or HF name)")
    _check_local_model(args.model)
    options: dict[str, Any] = {
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "scheduling_policy": args.scheduling_policy,
        "runner": getattr(args, "runner", None),
    }
    try:
        config = VllmConfig(
            model=args.model,
            served_model_name=args.served_model_name,
            dtype=args.dtype,
            tensor_parallel_size=args.tensor_parallel_size,
            enforce_eager=args.enforce_eager,
            enable_prefix_caching=not args.no_prefix_caching,
            **{k: v for k, v in options.items() if v is not None},
        )
    except ValueError as err:
        raise EngineConfigError(f"vllm engine: {err}") from None
    from services.worker.vllm.engine import VllmEngine

    return VllmEngine(config)
