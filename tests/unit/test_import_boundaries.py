from pathlib import Path

from tools.check_imports import imported_modules, violations


def test_the_tree_respects_its_import_boundaries() -> None:
    assert violations() == []


def test_a_service_importing_another_is_reported(tmp_path: Path) -> None:
    (tmp_path / "services" / "edge").mkdir(parents=True)
    (tmp_path / "services" / "edge" / "bad.py").write_text(
        "from services.router.fleet import WorkerRegistry\nimport vllm\n"
    )
    found = violations(tmp_path)
    assert any("edge imports services.router.fleet" in v for v in found)
    assert any("only the vLLM engine modules may import vllm" in v for v in found)


def test_relative_imports_are_ignored(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("from . import x\nimport os\n")
    assert list(imported_modules(f)) == [(2, "os")]
