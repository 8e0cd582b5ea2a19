"""Architecture boundaries, checked by `make test` (like GIE's verify-framework-imports):

1. services do not import each other: edge, router and worker share code only through
   ``services.common`` and talk only through the ``meridian.v1`` gRPC contracts;
2. only the vLLM engine modules import ``vllm`` (and ``torch``/``transformers``), so a
   simulated worker, the router and the edge never load them;
3. ``services.common`` imports no service.

The local-stack launcher (``services.localstack``) supervises every service and may import
their modules; the network emulator (``services.netem``) is standalone.

Exit code 1 and one line per violation: ``path:line: edge imports services.router``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("edge", "router", "worker", "netem")
# Modules allowed to import the heavy ML stack.
VLLM_MODULES = {
    "services/worker/vllm/engine.py",
    "services/worker/vllm/stats.py",
    "services/worker/vllm/tinymodel.py",
}
ML_PACKAGES = ("vllm", "torch", "transformers", "tokenizers")


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def violations(root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted((root / "services").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        owner = parts[1] if len(parts) > 2 else ""
        for line, module in imported_modules(path):
            top = module.split(".")[0]
            if top in ML_PACKAGES and rel not in VLLM_MODULES:
                out.append(f"{rel}:{line}: only the vLLM engine modules may import {module}")
            if not module.startswith("services."):
                continue
            target = module.split(".")[1]
            if owner == "common" and target in (*SERVICES, "localstack"):
                out.append(f"{rel}:{line}: common imports {module}")
            elif owner in SERVICES and target in (*SERVICES, "localstack") and target != owner:
                out.append(f"{rel}:{line}: {owner} imports {module}")
    return out


def main() -> int:
    found = violations()
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} import boundary violation(s)", file=sys.stderr)
        return 1
    print("import boundaries: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
