"""The sweep's state has owners (issue 18): the environment a sweep is built with is frozen, and the
progress counters (sweep.json, the console, the summary) are written by the record verb alone. This
reads every module of the package, as tests/test_layers.py reads the imports, and fails on a write
to the progress anywhere but orchestrator/sweep/_record.py (its functions: stop, launched, skipped,
baseline_measured_at, recovered, record...)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from orchestrator.sweep._context import Context, Progress, SweepEnv

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
OWNER = PACKAGE / "sweep" / "_record.py"
MUTATORS = frozenset({"append", "extend", "insert", "pop", "clear", "update", "remove", "setdefault", "__setitem__"})
FIELDS = frozenset(f.name for f in dataclasses.fields(Progress))


def _is_progress(node: ast.AST, aliases: set[str]) -> bool:
    """`<x>.progress` or a local name bound to it."""
    return (isinstance(node, ast.Attribute) and node.attr == "progress") or (
        isinstance(node, ast.Name) and node.id in aliases
    )


def writes(tree: ast.AST) -> list[int]:
    """Lines that change a Progress: `<progress>.<field> = / += ...`, `<progress>.<field>[k] = ...`,
    `<progress>.<field>.append(...)` and the like, through `ctx.progress` or an alias of it."""
    aliases = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute) and n.value.attr == "progress"
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    found = []
    for n in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = list(n.targets) if isinstance(n, ast.Assign) else [n.target]
        for t in targets:
            for part in ast.walk(t):
                if isinstance(part, ast.Subscript):
                    part = part.value
                if isinstance(part, ast.Attribute) and part.attr in FIELDS and _is_progress(part.value, aliases):
                    found.append(n.lineno)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS:
            owner = n.func.value
            if isinstance(owner, ast.Attribute) and owner.attr in FIELDS and _is_progress(owner.value, aliases):
                found.append(n.lineno)
    return sorted(set(found))


def test_the_reader_finds_writes() -> None:
    """Guards the guard: the owner itself writes, so a reader that found nothing there would be broken."""
    assert writes(ast.parse(OWNER.read_text()))
    sample = "p = ctx.progress\np.failed += 1\nctx.progress.failures[k] += 1\nctx.progress.baselines.append(x)\n"
    assert writes(ast.parse(sample)) == [2, 3, 4]


def test_only_the_record_verb_writes_the_progress() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == OWNER:
            continue
        for line in writes(ast.parse(path.read_text(), str(path))):
            wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    assert not wrong, "the progress is written through orchestrator/sweep/_record.py only:\n" + "\n".join(wrong)


def test_the_environment_is_frozen_and_the_context_cannot_replace_it(tmp_path: Path) -> None:
    assert dataclasses.fields(SweepEnv) and SweepEnv.__dataclass_params__.frozen  # type: ignore[attr-defined]
    for name in ("spec", "paths", "study", "executor", "clock", "emit", "policy", "budget_trials", "timeout_s"):
        prop = getattr(Context, name)
        assert isinstance(prop, property) and prop.fset is None, f"Context.{name} must be read-only"
    env = SweepEnv.__new__(SweepEnv)
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.timeout_s = 1.0  # type: ignore[misc]
