"""The dependency rule, enforced by reading every import of the package (function-local ones included).

- no cycle between project modules;
- each room imports only the rooms below it (docs/architecture.md draws the same table);
- optuna only in search/, ray only in execute/, mlflow only in tracking/;
- the simulator imports nothing from the core;
- a function-local import only defers a heavy third-party import, with a comment saying so (the CLI may
  also defer the project modules that pull such imports in).
"""

from __future__ import annotations

import ast
import graphlib
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"

LEAVES = frozenset({"records", "redact", "errors", "fsio", "stats", "nccllog", "clock"})
"""Modules of the package's top level that every room may use; they import only each other."""

ALLOWED: dict[str, frozenset[str]] = {
    "leaf": frozenset({"leaf"}),
    "config": frozenset({"leaf"}),
    "search": frozenset({"leaf", "config"}),
    "trial": frozenset({"leaf", "config"}),
    "probe": frozenset({"leaf", "config", "simulator"}),
    "results": frozenset({"leaf", "config", "simulator"}),
    "tracking": frozenset({"leaf", "config", "results"}),
    "execute": frozenset({"leaf", "config", "trial"}),
    "verdict": frozenset({"leaf", "config", "search", "trial", "probe", "results"}),
    "sweep": frozenset({"leaf", "config", "search", "trial", "probe", "results", "tracking", "execute", "verdict"}),
    "cli": frozenset(
        {"leaf", "config", "search", "trial", "probe", "results", "tracking", "execute", "verdict", "sweep"}
    ),
    "simulator": frozenset(),
    "testing": frozenset({"leaf", "config", "trial", "execute", "simulator", "results"}),
}
"""room -> the rooms it may import (besides itself)."""

ONE_ROOM = {"optuna": "search", "optuna_dashboard": "search", "ray": "execute", "mlflow": "tracking"}
"""Third-party packages that only one room may import."""

HEAVY = frozenset(
    {
        "ray",
        "mlflow",
        "torch",
        "pandas",
        "matplotlib",
        "scipy",
        "optuna",
        "optuna_dashboard",
        "plotly",
        "numpy",
        "nbformat",
        "nbclient",
        "psycopg2",
        "sglang",
    }
)
"""Third-party packages slow enough to import that deferring them into a function is worth it."""


@dataclass(frozen=True)
class Import:
    module: str  # importing module, dotted
    target: str  # imported module, dotted (a project module, or a top-level third-party name)
    line: int
    local: bool  # inside a function
    commented: bool  # a comment on the line or the line above


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The longest prefix of `name` that is a project module (`a.b.c` -> `a.b` when c is an attribute)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def _imports(path: Path, modules: dict[str, Path]) -> list[Import]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    me = _module_name(path)
    found: list[Import] = []

    def commented(node: ast.stmt) -> bool:
        here = lines[node.lineno - 1]
        above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
        return "#" in here or above.startswith("#")

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target = _resolve(alias.name, modules) if alias.name.startswith("orchestrator") else alias.name
                    found.append(Import(me, target, child.lineno, local, commented(child)))
            elif isinstance(child, ast.ImportFrom):
                if child.level:  # relative: resolve against this module's package
                    base = me if path.name == "__init__.py" else me.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        base = base.rpartition(".")[0]
                    mod = f"{base}.{child.module}" if child.module else base
                else:
                    mod = child.module or ""
                if mod.startswith("orchestrator"):
                    # `from pkg import sub` runs pkg/__init__.py first: an edge to the package too.
                    if mod in modules and mod != me:
                        found.append(Import(me, mod, child.lineno, local, commented(child)))
                    for alias in child.names:
                        found.append(
                            Import(me, _resolve(f"{mod}.{alias.name}", modules), child.lineno, local, commented(child))
                        )
                elif mod != "__future__":
                    found.append(Import(me, mod, child.lineno, local, commented(child)))
            visit(child, inner)

    visit(tree, False)
    return found


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    if parts[1] in LEAVES:
        return "leaf"
    if parts[1] == "cli":
        return "cli"
    return parts[1]


MODULES = _project_modules()
IMPORTS = [imp for path in sorted(MODULES.values()) for imp in _imports(path, MODULES)]
PROJECT = [imp for imp in IMPORTS if imp.target.startswith("orchestrator")]


def _where(imp: Import) -> str:
    return f"{MODULES[imp.module].relative_to(PACKAGE.parent)}:{imp.line} imports {imp.target}"


def test_the_reader_sees_every_room() -> None:
    """Guards the guard: if the reader stopped finding imports, every rule below would pass vacuously."""
    rooms = {_room(m) for m in MODULES} - {"package", "reference"}
    assert set(ALLOWED) >= rooms, f"rooms without a rule: {sorted(rooms - set(ALLOWED))}"
    importing = {_room(imp.module) for imp in PROJECT}
    assert {"cli", "sweep", "execute", "tracking", "trial", "search", "config"} <= importing
    assert any(imp.local for imp in IMPORTS), "no function-local import found at all: the reader is broken"


def test_no_cycle_between_project_modules() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in PROJECT:
        if imp.target != imp.module and imp.target in MODULES:
            graph[imp.module].add(imp.target)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        cycle = exc.args[1]
        pytest.fail("import cycle: " + " -> ".join(cycle))


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_each_room_imports_only_the_rooms_below_it(room: str) -> None:
    wrong = []
    for imp in PROJECT:
        src, dst = _room(imp.module), _room(imp.target)
        if src != room or dst in (room, "package") or imp.target == "orchestrator.reference":
            continue
        if dst not in ALLOWED[room]:
            wrong.append(_where(imp) + f" ({room} -> {dst})")
    assert not wrong, f"{room} may import only {sorted(ALLOWED[room]) or 'itself'}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package, room", sorted(ONE_ROOM.items()))
def test_third_party_boundaries_have_one_room(package: str, room: str) -> None:
    outside = [_where(imp) for imp in IMPORTS if imp.target.split(".")[0] == package and _room(imp.module) != room]
    assert not outside, f"{package} is imported only in {room}/:\n" + "\n".join(outside)


def test_function_local_imports_only_defer_heavy_packages_and_say_so() -> None:
    wrong = []
    for imp in IMPORTS:
        if not imp.local:
            continue
        top = imp.target.split(".")[0]
        if imp.target.startswith("orchestrator"):
            # Only the CLI may defer a project module, to keep `validate` and `status` free of the
            # worker stack (Ray, MLflow) that `run` needs; it says so beside the import.
            if _room(imp.module) != "cli" or not imp.commented:
                wrong.append(_where(imp) + " (a project module: import it at the top, or move the shared piece down)")
        elif top not in HEAVY:
            wrong.append(_where(imp) + f" ({top} is cheap to import: import it at the top)")
        elif not imp.commented:
            wrong.append(_where(imp) + " (a deferred heavy import needs a comment saying why it is deferred)")
    assert not wrong, "function-local imports:\n" + "\n".join(wrong)


MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300
BIG_BY_NATURE = {"orchestrator.simulator.model"}
"""The simulator's performance model: one table of equations, read top to bottom."""


def test_rooms_stay_readable_no_hub_class_no_huge_module() -> None:
    too_big = []
    for name, path in MODULES.items():
        source = path.read_text(encoding="utf-8")
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES and name not in BIG_BY_NATURE:
            too_big.append(
                f"{path.relative_to(PACKAGE.parent)}: {lines} lines (> {MAX_MODULE_LINES}): split it by verb"
            )
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.ClassDef)
                and (size := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES
            ):
                too_big.append(
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno} class {node.name}: {size} lines "
                    f"(> {MAX_CLASS_LINES}): keep the class thin over verb modules"
                )
    assert not too_big, "\n".join(too_big)
