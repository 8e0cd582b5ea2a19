"""``--engine sim``: the worker's command line → a :class:`SimEngine`.

Options come from ``--sim-config`` (a YAML file of :class:`SimConfig` fields), then the model
flags every engine shares (``--model``/``--served-model-name``, ``--max-model-len``,
``--max-num-seqs``), then ``--sim KEY=VALUE`` overrides, in that order of precedence.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from services.common import yamlfile
from services.common.cli import UnreadableFile, read_text
from services.worker.engine import Engine, EngineConfigError
from services.worker.sim.config import SimConfig
from services.worker.sim.engine import SimEngine


def _parse_overrides(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise EngineConfigError(f"--sim {pair!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = yamlfile.safe_load(raw)
        except yaml.YAMLError as err:
            raise EngineConfigError(f"--sim {pair!r}: cannot parse value: {err}") from None
    return out


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yamlfile.safe_load(read_text(path, flag="--sim-config"))
    except UnreadableFile as err:  # missing, a directory, not UTF-8, ...
        raise EngineConfigError(str(err)) from None
    except yaml.YAMLError as err:
        raise EngineConfigError(f"--sim-config {path}: invalid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise EngineConfigError(f"--sim-config {path}: expected a mapping of SimConfig fields")
    return data


def from_args(args: argparse.Namespace) -> Engine:
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
