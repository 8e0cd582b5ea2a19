"""``--engine vllm``: the worker's command line → a :class:`VllmEngine`.

Flags are checked (:class:`VllmConfig` validates them) *before* vllm is imported: a typo costs
milliseconds, not the seconds of a 3.5 GB import.
"""

from __future__ import annotations

import argparse
import json
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


def _speculative(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise EngineConfigError(f"--speculative-config: not JSON ({err.msg})") from None
    except (ValueError, RecursionError) as err:  # a 5,000-digit number; nesting past the stack
        raise EngineConfigError(f"--speculative-config: not usable JSON ({err})") from None
    if not isinstance(value, dict):
        raise EngineConfigError("--speculative-config: must be a JSON object")
    return value


#: Which flag each VllmConfig field comes from, so a bad value names the flag.
_FLAGS = {
    "tool_call_parser": "--tool-call-parser",
    "enable_auto_tool_choice": "--enable-auto-tool-choice",
    "structured_outputs_backend": "--structured-outputs-backend",
    "tool_strict_level": "--tool-strict-level",
    "tool_call_constraint": "--tool-call-constraint",
    "structured_outputs_compact": "--structured-outputs-compact",
    "quantization": "--quantization",
    "speculative_config": "--speculative-config",
    "max_choices": "--max-choices",
}


def _flag_named(message: str) -> str:
    for field, flag in _FLAGS.items():
        if message.startswith(field):
            return f"{flag}: {message}"
    return f"vllm engine: {message}"


def from_args(args: argparse.Namespace) -> Engine:
    if not args.model:
        raise EngineConfigError("--model is required with --engine vllm (a folder or HF name)")
    _check_local_model(args.model)
    options: dict[str, Any] = {
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "scheduling_policy": args.scheduling_policy,
        "tool_call_parser": getattr(args, "tool_call_parser", None),
        "quantization": getattr(args, "quantization", None),
        "speculative_config": _speculative(getattr(args, "speculative_config", None)),
        "structured_outputs_backend": getattr(args, "structured_outputs_backend", None),
        "max_choices": getattr(args, "max_choices", None),
        "tool_strict_level": getattr(args, "tool_strict_level", None),
        "tool_call_constraint": getattr(args, "tool_call_constraint", None),
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
            enable_auto_tool_choice=bool(getattr(args, "enable_auto_tool_choice", False)),
            structured_outputs_compact=bool(getattr(args, "structured_outputs_compact", False)),
            engine_metrics=bool(getattr(args, "engine_metrics", False)),
            **{k: v for k, v in options.items() if v is not None},
        )
    except ValueError as err:
        raise EngineConfigError(_flag_named(str(err))) from None
    from services.worker.vllm.engine import VllmEngine
    from services.worker.vllm.features import check_engine_options

    check_engine_options(config)  # names vLLM knows (parsers, quantization methods)
    return VllmEngine(config)
