"""The architecture's import rules (docs/ARCHITECTURE.md), checked on the source (lazy imports count).

- layers point one way: ``app`` -> ``recorders`` -> ``mem_core``; ``bench`` may use them all, nothing uses ``bench``;
- ``mem_core`` never imports Qt, ZMQ, ``app``, ``recorders``; ``recorders`` never imports Qt or ``app``;
- the run format (``mem_core/runs``: run directories, lineage, exports) and inference lie below training;
- the viewer never reaches torch, not even through the modules it imports;
- no import circle between files, and no private (``_name``) import from another module.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mem_core", "recorders", "app", "bench")
QT = ("PySide6", "pyqtgraph", "shiboken6")
RULES = {  # folder -> modules it must not import
    "mem_core": (*QT, "zmq", "app", "recorders", "bench"),
    "recorders": (*QT, "app", "bench"),
    "app": ("bench",),
    "app/viewer": ("torch", "timm"),
    "mem_core/runs": ("mem_core.train",),
    "mem_core/inference": ("mem_core.train",),
}
GUI = "app/viewer"
GUI_NEVER_REACHES = ("torch", "timm")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in PACKAGES if (root / pkg).is_dir() for p in (root / pkg).rglob("*.py")}


def imports(path: Path, name: str) -> list[tuple[str, str]]:
    """(module, imported name or "") of every import in the file, at any depth (function-level ones included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found += [(base, alias.name) for alias in node.names]
    return found


@functools.cache  # one parse of the tree per test run (the checks below read it dozens of times)
def graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]], list[str]]:
    """Per project module: the project modules it imports, every module name it imports, and private imports."""
    modules = project_modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges, names, private = {}, {}, []
    for name, path in modules.items():
        edges[name], names[name] = set(), set()
        for module, item in imports(path, name):
            target = resolve(f"{module}.{item}" if item else module) if module else None
            names[name].add(module)
            if target and target != name:
                edges[name].add(target)
            owner = resolve(module)
            if item.startswith("_") and not item.startswith("__") and owner and owner != name:
                private.append(f"{name} imports {item} from {module}")
    return edges, names, private


def violations(folder: str, forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    _, names, _ = graph(root)
    prefix = folder.replace("/", ".")
    return [
        f"{module} imports {name}"
        for module, imported in sorted(names.items())
        if module == prefix or module.startswith(prefix + ".")
        for name in sorted(imported)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]


def cycles(root: Path = ROOT) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), i.e. the import circles."""
    edges, _, _ = graph(root)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def reaches(start: str, targets: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """Import chains from the project module ``start`` to any of ``targets`` (third-party names), lazy included."""
    edges, names, _ = graph(root)
    chains, seen, todo = [], {start}, [(start, [start])]
    while todo:
        module, chain = todo.pop()
        chains += [" -> ".join([*chain, n]) for n in sorted(names[module]) if n.split(".")[0] in targets]
        for nxt in sorted(edges[module] - seen):
            seen.add(nxt)
            todo.append((nxt, [*chain, nxt]))
    return chains


@pytest.mark.parametrize("folder", sorted(RULES))
def test_package_respects_layering(folder):
    found = (ROOT / f"{folder}.py").is_file() or any((ROOT / folder).rglob("*.py"))
    assert found, f"{folder} is gone: update the rules with the architecture"
    assert violations(folder, RULES[folder]) == []


def test_no_import_circles_lazy_imports_included():
    assert cycles() == []


def test_no_private_names_are_imported_from_another_module():
    assert graph(ROOT)[2] == []


def test_the_viewer_never_reaches_torch():
    gui = [m for m in project_modules(ROOT) if m.startswith(GUI.replace("/", "."))]
    assert gui, f"{GUI} is gone"
    assert [chain for m in gui for chain in reaches(m, GUI_NEVER_REACHES)] == []


def test_the_run_lineage_never_reaches_torch():
    # `mem serve` asks which pretraining run a served model came from before it loads any model
    assert reaches("mem_core.runs.lineage", GUI_NEVER_REACHES) == []


def test_the_onnx_live_path_never_reaches_torch():
    # `mem serve --model model.onnx` runs where torch is not installed (test_onnx.py serves from such an install; the
    # server's loader imports torch only for a torch model)
    for module in ("mem_core.onnx_inference", "mem_core.runs.onnx_model"):
        assert reaches(module, GUI_NEVER_REACHES) == []


def test_the_command_line_starts_without_heavy_libraries():
    # `mem --help`, `mem view` and every other command import app.cli first: torch alone takes seconds to import
    code = "import sys, app.cli; print(sorted(m for m in ('torch', 'timm', 'numba', 'h5py', 'PySide6') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert loaded.stdout.strip() == "[]"


# ---- the checker itself catches what it must (a synthetic tree per rule) ---------------------------------------


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_checker_catches_forbidden_imports_lazy_ones_too(tmp_path):
    root = write(tmp_path, {"mem_core/bad.py": "import zmq\n\ndef f():\n    from PySide6 import QtCore\n"})
    assert violations("mem_core", RULES["mem_core"], root) == [
        "mem_core.bad imports PySide6",
        "mem_core.bad imports zmq",
    ]


def test_checker_catches_a_circle_through_a_lazy_import(tmp_path):
    root = write(
        tmp_path,
        {
            "mem_core/__init__.py": "",
            "mem_core/a.py": "from mem_core.b import x\n",
            "mem_core/b.py": "x = 1\n\ndef f():\n    from mem_core import a\n",
        },
    )
    assert cycles(root) == [["mem_core.a", "mem_core.b"]]


def test_checker_catches_private_imports_and_reached_libraries(tmp_path):
    root = write(
        tmp_path,
        {
            "mem_core/__init__.py": "",
            "mem_core/kernels.py": "import torch\n_helper = 1\n",
            "mem_core/user.py": "from mem_core.kernels import _helper\n",
            "app/viewer/window.py": "from mem_core import user\n",
        },
    )
    assert graph(root)[2] == ["mem_core.user imports _helper from mem_core.kernels"]
    assert reaches("app.viewer.window", ("torch",), root) == [
        "app.viewer.window -> mem_core.user -> mem_core.kernels -> torch"
    ]
