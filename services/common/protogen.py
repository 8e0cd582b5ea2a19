"""Generate the Python gRPC code for proto/meridian/v1 with grpcio-tools.

One function, used by the build (``make proto``) and by the drift test, so that what the build
produces and what the test compares against are made the same way. The output is a package
tree ``meridian/v1/*_pb2.py`` (+ ``.pyi`` stubs and ``*_pb2_grpc.py``) under ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "proto"


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    """Every contract file, sorted so generation order is stable."""
    return sorted(root.glob("meridian/v1/*.proto"))


def generate(out: Path, root: Path = PROTO_ROOT) -> None:
    """Write the generated modules for every proto under ``root`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    grpc_include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{grpc_include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(p.relative_to(root)) for p in proto_files(root)),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    args = parser.parse_args(argv)
    try:
        generate(args.out)
    except RuntimeError as exc:
        print(f"protogen: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
