"""scripts/walk.py, the static trace of what a reader follows from an entry point (issue 33's measure of the
verdict's tangle): it follows calls through names and imported project modules, each function once, and
counts stays (runs of one module) and returns (a stay in a module left before)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "walk.py"


def test_stays_and_returns_of_a_small_package(tmp_path: Path) -> None:
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
