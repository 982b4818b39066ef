#!/usr/bin/env python3
"""Walk the code a reader follows from an entry point, and count how often the walk changes module.

A static trace: from the entry function, each call to a project function (a name defined in the same
module, a name imported from a project module, or `module.name` through an imported project module) is
followed depth-first in source order, each function once. A *stay* is a run of consecutive functions in one
module; a *return* is a stay in a module the walk had already left. Calls through objects (methods, the
port, callbacks) are not followed: that is the point of a port, the reader stops at it.

    scripts/walk.py orchestrator.verdict.promote:promote [--root .] [--show] [--check MAX_STAYS MAX_RETURNS]

With --check it exits 1 when the walk takes more stays or more returns than given (tests/test_walk_script.py
holds the confirmation's entry point to issue 33's bound that way).
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Module:
    name: str
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    names: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Imported name -> (module, function)."""
    modules: dict[str, str] = field(default_factory=dict)
    """Imported alias -> project module."""


def _load(root: Path, name: str, cache: dict[str, Module | None]) -> Module | None:
    if name in cache:
        return cache[name]
    path = root.joinpath(*name.split(".")).with_suffix(".py")
    if not path.exists():
        path = root.joinpath(*name.split("."), "__init__.py")
    if not path.exists():
        cache[name] = None
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mod = Module(name)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mod.functions[node.name] = node  # type: ignore[assignment]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("orchestrator"):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if root.joinpath(*target.split(".")).with_suffix(".py").exists():
                    mod.modules[alias.asname or alias.name] = target
                else:
                    mod.names[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("orchestrator") and alias.asname:
                    mod.modules[alias.asname] = alias.name
    cache[name] = mod
    return mod


def _calls(fn: ast.FunctionDef, mod: Module) -> list[tuple[str, str]]:
    """(module, function) of each project call in `fn`, in source order."""
    out = []
    for node in sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)):
        f = node.func
        if isinstance(f, ast.Name):
            if f.id in mod.functions:
                out.append((mod.name, f.id))
            elif f.id in mod.names:
                out.append(mod.names[f.id])
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in mod.modules:
            out.append((mod.modules[f.value.id], f.attr))
    return out


def walk(root: Path, entry: str) -> list[tuple[str, str]]:
    """The functions the walk visits, in order, from `module:function`."""
    cache: dict[str, Module | None] = {}
    start_mod, start_fn = entry.split(":")
    seen: set[tuple[str, str]] = set()
    order: list[tuple[str, str]] = []

    def visit(module: str, function: str) -> None:
        mod = _load(root, module, cache)
        if mod is None or function not in mod.functions or (module, function) in seen:
            return
        seen.add((module, function))
        order.append((module, function))
        for callee in _calls(mod.functions[function], mod):
            visit(*callee)

    visit(start_mod, start_fn)
    return order


def stays(order: list[tuple[str, str]]) -> tuple[list[str], int]:
    """The modules of each stay, and how many stays return to a module left before."""
    runs: list[str] = []
    for module, _ in order:
        if not runs or runs[-1] != module:
            runs.append(module)
    returns = sum(1 for i, m in enumerate(runs) if m in runs[:i])
    return runs, returns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entry", help="module:function, e.g. orchestrator.verdict.promote:promote")
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--show", action="store_true", help="print each stay")
    parser.add_argument(
        "--check",
        nargs=2,
        type=int,
        metavar=("MAX_STAYS", "MAX_RETURNS"),
        help="exit 1 when the walk takes more stays or more returns than these",
    )
    args = parser.parse_args(argv)
    order = walk(args.root, args.entry)
    runs, returns = stays(order)
    if args.show:
        for module in runs:
            print(f"  {module}")
    print(f"{args.entry}: {len(order)} functions, {len(runs)} stays, {returns} returns, {len(set(runs))} modules")
    if args.check is not None:
        max_stays, max_returns = args.check
        if len(runs) > max_stays or returns > max_returns:
            print(
                f"{args.entry}: {len(runs)} stays and {returns} returns, above the bound of {max_stays} and "
                f"{max_returns}: follow the walk with --show and keep each phase's helpers with it",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
