"""scripts/walk.py, the static trace of what a reader follows from an entry point (issue 33's measure of the
verdict's tangle): it follows calls through names and imported project modules, each function once, and
counts stays (runs of one module) and returns (a stay in a module left before); `--check` holds the
confirmation's entry point to issue 33's bound (35 stays, 12 returns), so the figure cannot regress."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "walk.py"


def _small_package(tmp_path: Path) -> None:
    """a.entry -> a.first, b.helper -> c.deep, a.last, and deep again: 4 stays, 1 return."""
    pkg = tmp_path / "orchestrator" / "room"
    pkg.mkdir(parents=True)
    (tmp_path / "orchestrator" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from orchestrator.room import b\nfrom orchestrator.room.c import deep\n\n"
        "def entry():\n    first()\n    b.helper()\n    last()\n    deep()\n\n"
        "def first():\n    pass\n\ndef last():\n    obj.method()\n"
    )
    (pkg / "b.py").write_text("from orchestrator.room import c\n\ndef helper():\n    c.deep()\n")
    (pkg / "c.py").write_text("def deep():\n    pass\n")


def test_stays_and_returns_of_a_small_package(tmp_path: Path) -> None:
    _small_package(tmp_path)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "orchestrator.room.a:entry", "--root", str(tmp_path), "--show"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # a.entry, a.first | b.helper | c.deep | a.last (a return to a); the second call of deep is not followed again
    assert out.splitlines()[:4] == [
        "  orchestrator.room.a",
        "  orchestrator.room.b",
        "  orchestrator.room.c",
        "  orchestrator.room.a",
    ]
    assert out.splitlines()[-1] == "orchestrator.room.a:entry: 5 functions, 4 stays, 1 returns, 3 modules"


ROOT = SCRIPT.parents[1]


def _check(entry: str, *bound: str, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), entry, "--root", str(root), "--check", *bound],
        capture_output=True,
        text=True,
    )


def test_check_fails_above_the_bound_and_passes_at_it(tmp_path: Path) -> None:
    _small_package(tmp_path)
    assert _check("orchestrator.room.a:entry", "4", "1", root=tmp_path).returncode == 0
    above = _check("orchestrator.room.a:entry", "3", "1", root=tmp_path)
    assert above.returncode == 1 and "4 stays and 1 returns, above the bound of 3 and 1" in above.stderr
    assert _check("orchestrator.room.a:entry", "4", "0", root=tmp_path).returncode == 1


def test_the_confirmation_reads_through_its_phases_in_order() -> None:
    # Issue 33: from the promotion's entry point, at most 35 stays and 12 returns to a module already left
    # (pick -> arms and the night's schedule -> the rounds with the gate -> the choice -> the correctness
    # gate -> the deployed configuration and its registration).
    found = _check("orchestrator.verdict.promote:promote", "35", "12")
    assert found.returncode == 0, found.stdout + found.stderr
