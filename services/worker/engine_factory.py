"""Which engine a worker runs: ``--engine NAME`` → that engine's ``from_args``.

Each engine package owns the translation of the command line into its own validated config
(``sim/options.py``, ``vllm/options.py``). This table only names them, and imports the chosen
one lazily: a simulated worker never imports vLLM (3.5 GB of it), and a vLLM worker never
reads the simulator's options.

To add an engine: give it an ``options.py`` with ``from_args(args) -> Engine`` and list it
here.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import cast

from services.worker.engine import Engine

#: engine name → module with ``from_args(args: argparse.Namespace) -> Engine``.
ENGINE_OPTIONS: dict[str, str] = {
    "sim": "services.worker.sim.options",
    "vllm": "services.worker.vllm.options",
    "openai": "services.worker.upstream.options",
}
ENGINE_NAMES = tuple(ENGINE_OPTIONS)


def build_engine(args: argparse.Namespace) -> Engine:
    """The engine ``args.engine`` names, built from ``args`` (raises ``EngineConfigError``)."""
    module = importlib.import_module(ENGINE_OPTIONS[args.engine])
    from_args = cast(Callable[[argparse.Namespace], Engine], module.from_args)
    return from_args(args)
