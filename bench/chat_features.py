"""What the edge's request parsing costs for plain chat and for the chat-completions features
(tools with their metaschema check, a json_schema response format, n): parse + checks +
token estimate, in process, best of ``--repeats`` runs of ``--iterations`` each (prints only).

    .venv/bin/python -m bench.chat_features [--iterations 20000] [--repeats 5]

Run it in two trees (``PYTHONPATH=<tree>:<tree>/build/gen``) to compare a change with its
base on the plain body: bench/README.md has such a paired run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from services.common import cli
from services.edge.openai_types import parse_chat_request
from services.edge.prompt import estimate_prompt_tokens

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about the weather in Seoul today, please."},
]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 7}},
    "required": ["city", "days"],
}
BODIES: dict[str, dict[str, Any]] = {
    "plain": {},
    "tools (1, metaschema-checked)": {
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    },
    "response_format json_schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}
    },
    "n=4": {"n": 4},
}


def best_us(raw: bytes, iterations: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            estimate_prompt_tokens(parse_chat_request(raw))
        best = min(best, (time.perf_counter() - start) / iterations * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=cli.positive_int, default=20000)
    parser.add_argument("--repeats", type=cli.positive_int, default=5)
    args = parser.parse_args()
    print(f"chat_features: load average {os.getloadavg()[0]:.1f}")
    base = {"model": "meridian-sim", "messages": MESSAGES, "max_tokens": 64, "stream": True}
    plain = None
    for name, extra in BODIES.items():
        raw = json.dumps({**base, **extra}).encode()
        us = best_us(raw, args.iterations, args.repeats)
        plain = plain or us
        print(f"{name:<32} {us:8.2f} us  ({us / plain:.2f}x plain)")


if __name__ == "__main__":
    main()
