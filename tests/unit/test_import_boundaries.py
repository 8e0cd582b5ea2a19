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


def test_the_planet_may_use_only_the_scheduling_framework_and_the_sim_engine(
    tmp_path: Path,
) -> None:
    (tmp_path / "services" / "planet").mkdir(parents=True)
    (tmp_path / "services" / "router").mkdir(parents=True)
    (tmp_path / "services" / "planet" / "ok.py").write_text(
        "from services.router.scheduling.profile import load_profile\n"
        "from services.worker.sim.config import SimConfig\n"
        "from services.worker.engine import EngineRequest\n"
        "from services.common.clock import Clock\n"
    )
    (tmp_path / "services" / "planet" / "bad.py").write_text(
        "from services.router.registry import WorkerRegistry\n"
        "from services.edge.prompt import prefix_hashes\n"
    )
    (tmp_path / "services" / "router" / "uses_planet.py").write_text(
        "from services.planet.sim import Planet\n"
    )
    found = violations(tmp_path)
    assert sorted(v.split(":")[0] for v in found) == [
        "services/planet/bad.py",
        "services/planet/bad.py",
        "services/router/uses_planet.py",
    ]
    assert any("planet imports services.router.registry" in v for v in found)
    assert any("router imports services.planet.sim" in v for v in found)
