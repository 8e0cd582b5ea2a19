"""Architecture boundaries, checked by `make test` (like GIE's verify-framework-imports):

1. services do not import each other: edge, router and worker share code only through
   ``services.common`` and talk only through the ``meridian.v1`` gRPC contracts;
2. only the vLLM engine modules import ``vllm`` (and ``torch``/``transformers``), so a
   simulated worker, the router and the edge never load them;
3. ``services.common`` imports no service.

The local-stack launcher (``services.localstack``) supervises every service and may import
their modules; the network emulator (``services.netem``) is standalone.

4. the planet simulator (``services.planet``) is the one explicit exception to rule 1, and a
   narrow one: it runs the router's *scheduling framework* and the worker's *simulated engine*
   unchanged, so it may import ``services.router.scheduling`` and ``services.worker.sim`` (and
   ``services.worker.engine``, the engine types the simulator's core speaks) — nothing else of
   either service (not the registry, not gRPC servers), and no service imports it.

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
    "services/worker/vllm/features.py",
    "services/worker/vllm/stats.py",
    "services/worker/vllm/tinymodel.py",
}
ML_PACKAGES = ("vllm", "torch", "transformers", "tokenizers")
# What services.planet may import from the services (rule 4); services.common is shared anyway.
PLANET_ALLOWED = ("services.router.scheduling", "services.worker.sim", "services.worker.engine")


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
            if owner == "planet":
                if target in (*SERVICES, "localstack") and not any(
                    module == a or module.startswith(a + ".") for a in PLANET_ALLOWED
                ):
                    out.append(
                        f"{rel}:{line}: planet imports {module} (only "
                        f"{', '.join(PLANET_ALLOWED)} of the services)"
                    )
                continue
            if target == "planet":
                out.append(f"{rel}:{line}: {owner or 'services'} imports {module}")
            elif owner == "common" and target in (*SERVICES, "localstack"):
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
