"""The README's layout section is a map a newcomer trusts: every path it names must exist,
and every service folder must have the README it points to."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layout_paths() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    return [m.group(1) for m in re.finditer(r"^([a-z][\w./-]*/)\s", block, re.MULTILINE)]


def test_the_layout_section_names_many_folders() -> None:
    assert len(layout_paths()) >= 15  # the parser still finds the block


def test_every_folder_the_readme_names_exists() -> None:
    missing = [p for p in layout_paths() if not (ROOT / p).is_dir()]
    assert missing == []


def test_every_service_has_its_readme() -> None:
    for service in ("edge", "router", "worker"):
        assert (ROOT / "services" / service / "README.md").is_file()
        assert (ROOT / "services" / service / "server.py").is_file()  # its composition root
