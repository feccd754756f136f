"""The package's shape: its import layers point down only, no import cycle (imports inside functions count too), and
no module over 400 lines.

The layers, bottom to top (a module imports only its own top-level package and those of its layer or below):

    compat, cache, durable, redaction, rng, version, ops, rollout, reward_checks, reward_watch   (the foundations)
    < data < reporting < distributed < models < generation < agents, rewards, judges < checkpoint < publish
    < callbacks < trainers < the package root (steadyrl/__init__.py) < toy, real < cli, __main__

toy/ and real/ (the toy task, the real-model fixture and the demos) sit above the trainers they drive; only cli/
(``steadyrl demo``, ``--toy``) imports them. docs/architecture.md explains each layer.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "steadyrl"
MAX_LINES = 400
ROOT = "__init__"  # the package root's name in LAYERS
LAYERS = [
    {
        "compat",
        "cache",
        "durable",
        "redaction",
        "rng",
        "version",
        "ops",
        "rollout",
        "vision",
        "reward_checks",
        "reward_watch",
    },
    {"data"},
    {"reporting"},
    {"distributed"},
    {"models"},
    {"generation"},
    {"agents", "rewards", "judges"},
    {"checkpoint"},
    {"publish"},
    {"callbacks"},
    {"trainers"},
    {ROOT},
    {"toy", "real"},
    {"cli", "__main__"},
]
DEMOS, DEMO_USERS = {"toy", "real"}, {"toy", "real", "cli"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports anywhere: at module level, inside functions, under ``if``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: imports(path, set(paths)) for name, path in paths.items()}


def import_cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph = import_graph()
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


def top_level(module: str) -> str:
    """The top-level package (or module) of ``steadyrl`` that ``module`` belongs to; ``ROOT`` for the root itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def layer_of(name: str) -> int:
    layers = [i for i, layer in enumerate(LAYERS) if name in layer]
    assert len(layers) == 1, f"steadyrl's {name} must be in exactly one of LAYERS (tests/unit/test_layout.py)"
    return layers[0]


def upward_imports() -> list[str]:
    """Every import of a module from a top-level package of a higher layer than the importer's."""
    graph, found = import_graph(), []
    for name in sorted({top_level(module) for module in graph}):
        layer_of(name)  # every top-level package and module has its layer
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            source, goal = top_level(name), top_level(target)
            if layer_of(goal) > layer_of(source):
                found.append(f"{name} -> {target} ({source} is below {goal})")
    return found


def demo_imports() -> list[str]:
    """Every import of toy/ or real/ by a module outside toy/, real/ and cli/."""
    return [
        f"{name} -> {target}"
        for name, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if top_level(target) in DEMOS and top_level(name) not in DEMO_USERS
    ]


def test_the_package_has_no_import_cycle():
    assert import_cycles() == []


def test_every_import_goes_to_the_same_layer_or_below():
    assert upward_imports() == []


def test_only_the_command_line_imports_the_demos():
    assert demo_imports() == []


def make_package(tmp_path: Path, monkeypatch, files: dict[str, str]) -> None:
    package = tmp_path / "steadyrl"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)


def test_the_checker_finds_a_cycle_through_a_function(tmp_path, monkeypatch):
    files = {"sub/__init__.py": "", "a.py": "from .sub import b\n", "c.py": "from steadyrl.a import thing\n"}
    make_package(tmp_path, monkeypatch, {**files, "sub/b.py": "import os\n"})
    assert import_cycles() == []
    (tmp_path / "steadyrl" / "sub" / "b.py").write_text("import os\n\ndef later():\n    from .. import c\n")
    assert import_cycles() == [["steadyrl.a", "steadyrl.c", "steadyrl.sub.b"]], "imports inside functions count"


def test_the_checker_finds_an_upward_import(tmp_path, monkeypatch):
    files = {
        "low/__init__.py": "",
        "low/a.py": "import os\n",
        "high/__init__.py": "",
        "high/b.py": "from ..low import a\n",
    }
    make_package(tmp_path, monkeypatch, files)
    monkeypatch.setattr(sys.modules[__name__], "LAYERS", [{"low"}, {"high"}, {ROOT}])
    assert upward_imports() == []
    (tmp_path / "steadyrl" / "low" / "a.py").write_text("def later():\n    from steadyrl.high.b import thing\n")
    assert upward_imports() == ["steadyrl.low.a -> steadyrl.high.b (low is below high)"]


def test_no_module_is_over_400_lines():
    lengths = {
        path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert {path: n for path, n in lengths.items() if n > MAX_LINES} == {}
