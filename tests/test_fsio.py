"""Atomic writes: a reader sees the old file or the new one, never a part, and no temp file is left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import fsio


def test_write_atomic_replaces_whole_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "out" / "champion.env"
    fsio.write_atomic(target, "A=1\n")
    assert target.stat().st_mode & 0o777 == 0o644, "a new file is readable by all, not mkstemp's 0600"
    target.chmod(0o640)
    fsio.write_atomic(target, "A=2\n")
    assert target.read_text() == "A=2\n"
    assert target.stat().st_mode & 0o777 == 0o640, "the replaced file's mode is kept"
    assert sorted(p.name for p in target.parent.iterdir()) == ["champion.env"]


def test_write_atomic_sets_the_mode_it_is_given(tmp_path: Path) -> None:
    target = tmp_path / "secret.env"
    fsio.write_atomic(target, "A=1\n")
    fsio.write_atomic(target, "A=2\n", mode=0o600)
    assert target.stat().st_mode & 0o777 == 0o600


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path: Path) -> None:
    target = tmp_path / "champion.env"
    fsio.write_atomic(target, "A=1\n")
    with pytest.raises(UnicodeEncodeError):
        fsio.write_atomic(target, "A=\udcff\n")  # a lone surrogate cannot be encoded
    assert target.read_text() == "A=1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["champion.env"]


def test_write_json_is_indented_sorted_and_stringifies_paths(tmp_path: Path) -> None:
    target = tmp_path / "trials" / "0001" / "spec.json"
    fsio.write_json(target, {"b": 1, "a": {"dir": tmp_path}})
    text = target.read_text()
    assert text == json.dumps({"a": {"dir": str(tmp_path)}, "b": 1}, indent=2, sort_keys=True)
    assert json.loads(text)["a"]["dir"] == str(tmp_path)
