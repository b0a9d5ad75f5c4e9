"""docs/architecture.md names every package the project has, and every room of handler/ in the layer table
that tests/unit/test_layout.py enforces: a package added without a line on the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT
from tests.unit.test_layout import LAYERS, PACKAGES

PAGE = ROOT / "docs" / "architecture.md"


def packages(root: Path = ROOT) -> list[str]:
    """Every Python package under the shipped folders, dotted (`handler.core`, `infra.pack`), and every folder
    of bench/ that holds a script (bench's folders are scripts' homes, not packages)."""
    found = []
    for top in PACKAGES:
        for init in sorted((root / top).rglob("__init__.py")):
            parts = init.parent.relative_to(root).parts
            if "__pycache__" not in parts:
                found.append(".".join(parts))
    scripts = {p.parent for p in (root / "bench").rglob("*.py") if "__pycache__" not in p.parts}
    found += sorted(".".join(d.relative_to(root).parts) for d in scripts)
    return found


def unnamed(text: str, names: list[str]) -> list[str]:
    """The packages the page names neither dotted (`handler.core`) nor as a path (`handler/core`)."""
    return [n for n in names if not re.search(rf"`{re.escape(n)}[`./]|`{re.escape(n.replace('.', '/'))}[`/]", text)]


def test_the_page_names_every_package() -> None:
    names = packages()
    assert "handler.core" in names and "infra.pack" in names
    assert unnamed(PAGE.read_text(), names) == []


def test_the_layer_table_has_every_room_in_its_rank() -> None:
    text = PAGE.read_text()
    ranks = {(m[1] or "handler"): int(m[0]) for m in re.findall(r"^\| (-?\d+) \| `handler(?:\.(\w+))?`", text, re.M)}
    expected = {name: rank for name, rank in LAYERS.items() if name != "__main__"}  # one row for both entry points
    assert ranks == expected


def test_a_package_missing_from_the_page_is_found(tmp_path: Path) -> None:
    for pkg in ("handler/core", "handler/newroom", "infra", "warmers", "layers"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    for script in ("bench/runner.py", "bench/peers/run.py", "bench/newbench/run.py"):
        (tmp_path / script).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / script).write_text("")
    names = packages(tmp_path)
    page = "`handler.core` and `infra/`, `warmers/`, `layers/`, `bench/`, `bench/peers`, `handler` (root)"
    assert unnamed(page, names) == ["handler.newroom", "bench.newbench"]
