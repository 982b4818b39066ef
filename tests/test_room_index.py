"""Every room's `__init__.py` names every module in it (issue 33): a newcomer reads the room's index to find
where a change belongs, so a module the index does not name is a module nobody finds. A module counts as
named when its file name without `.py` appears in the docstring as a word (`contrib`, `_confirm`,
`report_html.py`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"


def _rooms() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))


def unnamed(room: Path) -> list[str]:
    """The modules of `room` its `__init__` docstring does not name."""
    doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text(encoding="utf-8"))) or ""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", doc))
    modules = [p.stem for p in room.glob("*.py") if p.stem != "__init__"]
    modules += [p.name for p in room.iterdir() if (p / "__init__.py").is_file()]
    return sorted(m for m in modules if m not in words)


def test_every_room_names_every_module_in_its_index() -> None:
    missing = {room.name: names for room in _rooms() if (names := unnamed(room))}
    assert not missing, "\n".join(
        f"orchestrator/{room}/__init__.py does not name {', '.join(names)}: add a line saying what each holds"
        for room, names in missing.items()
    )


def test_the_check_catches_a_module_the_index_leaves_out(tmp_path: Path) -> None:
    room = tmp_path / "room"
    room.mkdir()
    (room / "__init__.py").write_text('"""The room.\n\n- `named`: what it holds.\n"""\n')
    (room / "named.py").write_text("")
    assert unnamed(room) == []
    (room / "hidden.py").write_text("")
    assert unnamed(room) == ["hidden"]
