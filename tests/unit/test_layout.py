"""The package's shape: no import cycle among module-level imports, and no module over 400 lines."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "steadyrl"
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports at module level (imports inside functions run later: no cycle)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # ``from pkg import module`` imports the module
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {target for target in found if target in modules and target != name}


def import_cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: module_level_imports(path, set(paths)) for name, path in paths.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for neighbour in graph[node]:
            if neighbour not in index:
                visit(neighbour)
                low[node] = min(low[node], low[neighbour])
            elif neighbour in on_stack:
                low[node] = min(low[node], index[neighbour])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return cycles


def test_the_package_has_no_import_cycle():
    assert import_cycles() == []


def test_the_checker_finds_a_cycle(tmp_path, monkeypatch):
    package = tmp_path / "steadyrl"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("import os\n\ndef later():\n    from .. import c\n")
    (package / "c.py").write_text("from steadyrl.a import thing\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert import_cycles() == [], "an import inside a function is no cycle"
    (package / "sub" / "b.py").write_text("from ..c import thing\n")
    assert import_cycles() == [["steadyrl.a", "steadyrl.c", "steadyrl.sub.b"]]


def test_no_module_is_over_400_lines():
    lengths = {
        path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert {path: n for path, n in lengths.items() if n > MAX_LINES} == {}
