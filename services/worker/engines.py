"""Build the engine a worker runs from its command line.

Engines are imported lazily, so a simulated worker never imports vLLM (3.5 GB of it) and a
vLLM worker does not need the simulator's options.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from services.worker.engine import Engine

ENGINE_NAMES = ("sim", "vllm")


class EngineConfigError(ValueError):
    """A bad engine option; the message names the option."""


def _parse_overrides(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise EngineConfigError(f"--sim {pair!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise EngineConfigError(f"--sim {pair!r}: cannot parse value: {err}") from None
    return out


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise EngineConfigError(f"--sim-config {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise EngineConfigError(f"--sim-config {path}: invalid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise EngineConfigError(f"--sim-config {path}: expected a mapping of SimConfig fields")
    return data


def build_engine(args: argparse.Namespace) -> Engine:
    if args.engine == "sim":
        return _build_sim(args)
    return _build_vllm(args)


def _build_sim(args: argparse.Namespace) -> Engine:
    from services.worker.sim import SimConfig, SimEngine

    fields: dict[str, Any] = {}
    if args.sim_config is not None:
        fields.update(_load_yaml(args.sim_config))
    if args.model:
        fields["models"] = [args.served_model_name or args.model]
    if args.max_model_len is not None:
        fields["max_model_len"] = args.max_model_len
    if args.max_num_seqs is not None:
        fields["max_num_seqs"] = args.max_num_seqs
    fields.update(_parse_overrides(args.sim))
    try:
        config = SimConfig.from_mapping(fields)
    except ValueError as err:
        raise EngineConfigError(f"sim engine: {err}") from None
    return SimEngine(config)


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


def _build_vllm(args: argparse.Namespace) -> Engine:
    # vllm_config does not import vllm: flags are checked before the 3.5 GB import.
    from services.worker.vllm_config import VllmConfig

    if not args.model:
        raise EngineConfigError("--model is required with --engine vllm (a folder or HF name)")
    _check_local_model(args.model)
    options: dict[str, Any] = {
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "scheduling_policy": args.scheduling_policy,
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
    from services.worker.vllm_engine import VllmEngine

    return VllmEngine(config)
