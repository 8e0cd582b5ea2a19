"""Generated gRPC code is produced by the build and never edited: regenerate and compare."""

from pathlib import Path

from services.common import protogen

GEN = Path(__file__).resolve().parents[2] / "build" / "gen"


def test_generated_code_matches_the_protos(tmp_path: Path) -> None:
    protogen.generate(tmp_path)
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*.py*")}
    built = {p.relative_to(GEN): p.read_bytes() for p in GEN.rglob("*.py*")}
    assert fresh, "protoc produced nothing"
    assert sorted(built) == sorted(fresh), "build/gen is stale: run `make proto`"
    drifted = [str(p) for p in fresh if fresh[p] != built[p]]
    assert not drifted, f"generated files differ from the protos (hand-edited?): {drifted}"


def test_every_proto_declares_the_versioned_package() -> None:
    for proto in protogen.proto_files():
        assert "package meridian.v1;" in proto.read_text(), proto
