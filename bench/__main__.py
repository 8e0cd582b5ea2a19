"""``make bench`` / ``python -m bench``: list the benchmarks, or run one by name.

    python -m bench                 # list
    python -m bench overhead        # run bench/overhead.py with its defaults
    python -m bench overhead --concurrency 1 8

Each benchmark prints figures (ratios against a baseline measured in the same run); results
and the commands that produced them are recorded in bench/README.md.
"""

from __future__ import annotations

import ast
import pkgutil
import runpy
import sys
from pathlib import Path


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        for name in names:
            # Read the docstring without importing (some benchmarks import vLLM).
            source = (Path(__file__).parent / f"{name}.py").read_text()
            doc = (ast.get_docstring(ast.parse(source)) or "").splitlines()
            print(f"  {name:<20} {doc[0] if doc else ''}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"unknown benchmark {name!r}; one of: {', '.join(names)}", file=sys.stderr)
        return 2
    sys.argv = [f"bench.{name}", *rest]
    runpy.run_module(f"bench.{name}", run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
