"""The architecture's import rules (DESIGN.md §2): app -> recorders -> mem_core, GUI code never imports torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

QT = ("PySide6", "pyqtgraph", "shiboken6")
RULES = {
    "mem_core": (*QT, "zmq", "app", "recorders"),
    "recorders": (*QT, "app"),
    "app/viewer": ("torch", "timm", "mem_core.models", "mem_core.train"),
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def violations(package: str, forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / package).rglob("*.py")):
        for name in sorted(imported_modules(path)):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(root)} imports {name}")
    return found


@pytest.mark.parametrize("package", sorted(RULES))
def test_package_respects_layering(package):
    assert (ROOT / package).is_dir() or package == "app/viewer"
    assert violations(package, RULES[package]) == []


def test_checker_catches_a_forbidden_import(tmp_path):
    (tmp_path / "mem_core").mkdir()
    (tmp_path / "mem_core" / "bad.py").write_text("import zmq\nfrom PySide6 import QtCore\n")
    assert violations("mem_core", RULES["mem_core"], tmp_path) == [
        "mem_core/bad.py imports PySide6",
        "mem_core/bad.py imports zmq",
    ]
