"""Parts import downward only: ``tasks/`` imports nothing else of lengthbench, ``models/`` only ``kernels/``
and ``tasks/`` (the registry class), ``kernels/`` nothing; none of them the harness (every other ``lengthbench.*`` module). Read from the source
(``ast``), so an import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# part (its folder, installed as lengthbench.<part>) -> the parts it may import besides itself
ALLOWED = {"tasks": set(), "models": {"kernels", "tasks"}, "kernels": set()}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, relative imports resolved against its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ["lengthbench", *path.relative_to(ROOT).parent.parts]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found.append((node.lineno, module))
            if node.module is None or module in ("lengthbench", f"lengthbench.{package[1]}"):
                found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def part_of(module: str) -> str | None:
    """The part a ``lengthbench.*`` module belongs to: ``tasks``, ``models``, ``kernels`` or ``harness``; None
    for a module outside lengthbench."""
    parts = module.split(".")
    if parts[0] != "lengthbench":
        return None
    if len(parts) == 1:
        return "harness"
    return parts[1] if parts[1] in ALLOWED else "harness"


def upward_imports(folder: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, module in imported_modules(path):
            target = part_of(module)
            if target is not None and target != folder and target not in ALLOWED[folder]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_part_imports_only_downward(folder):
    assert (ROOT / folder).is_dir()
    assert upward_imports(folder) == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The test fails where it should: a module of ``tasks/`` importing the harness or ``models/`` is found,
    at module level or inside a function, as an absolute or a relative import."""
    fake = tmp_path / "tasks"
    fake.mkdir()
    (fake / "bad.py").write_text(
        "import os\nfrom lengthbench.config import RunConfig\n"
        "def f():\n    from lengthbench.models.registry import Registry\n    import lengthbench.store\n"
        "from .. import leaderboard\nfrom . import base\nfrom lengthbench.tasks import rng\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert sorted(line.split(" imports ")[1] for line in upward_imports("tasks")) == [
        "lengthbench", "lengthbench.config", "lengthbench.leaderboard", "lengthbench.models.registry",
        "lengthbench.store"]
