"""`sweep status` names the phase: search, confirming round k of N (from the confirmation folders and
promotion.max_rounds), done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.sweep.status import phase_of


@pytest.mark.parametrize(("status", "folders", "max_rounds", "phase"), [
    ("running", [], 12, "search"),
    ("running", ["00-champion", "00-baseline"], 12, "confirming round 1 of 12"),
    ("running", ["00-champion", "00-baseline", "01-champion", "01-no_speculation"], 12, "confirming round 2 of 12"),
    ("running", ["00-champion"], None, "confirming round 1"),
    ("finished", ["00-champion"], 12, "done"),
    ("stopped", [], 12, "done"),
])
def test_phase(tmp_path: Path, status: str, folders: list[str], max_rounds: int | None, phase: str) -> None:
    for name in folders:
        (tmp_path / "confirm" / name).mkdir(parents=True)
    (tmp_path / "experiment.json").write_text(json.dumps({"promotion": {"max_rounds": max_rounds}}))
    assert phase_of(tmp_path, status) == phase
