"""The tests' own layout, enforced by reading every import of tests/: a test module (test_*.py) imports no
other test module. What several test files share lives in a helper module (tests/e2e_helpers.py,
tests/sweep/loop_helpers.py, ...), so running, moving or deleting one test file never runs or breaks
another's tests, and pytest collects each test once."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_test_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import in `source` (function-local ones included) whose module's own name,
    the last dotted part, is a test module's (test_*); `from x import test_y` counts as importing test_y."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names = [base] if base else []
            names += [f"{base}.{alias.name}".lstrip(".") for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.rsplit(".", 1)[-1].startswith("test_")]
    return found


def test_the_rule_sees_each_way_of_importing_a_test_module() -> None:
    source = (
        "import os\n"
        "from loop_helpers import run_sweep\n"
        "from test_loop import run_sweep\n"
        "import tests.sweep.test_loop as loop\n"
        "from tests.sweep import test_confirm\n"
        "def f():\n"
        "    from test_ui import serving_ui\n"
    )
    assert [line for line, _ in imported_test_modules(source)] == [3, 4, 5, 7]
    assert imported_test_modules("from e2e_helpers import sweep\nimport pytest\n") == []


def test_no_test_module_imports_another_test_module() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)}:{line} imports {name}: move what it shares into a helper module"
        for path in sorted(TESTS.rglob("*.py"))
        for line, name in imported_test_modules(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
