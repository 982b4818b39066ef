"""`sweep status` and the live line of `sweep run` name the phase: search, confirming round k of N (from the confirmation folders and
promotion.max_rounds), done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.records import Metrics, TrialOutcome, TrialRole, TrialStatus
from orchestrator.sweep import state as st
from orchestrator.sweep.status import LiveProgress, phase_of


@pytest.mark.parametrize(
    ("status", "folders", "max_rounds", "phase"),
    [
        ("running", [], 12, "search"),
        ("running", ["00-champion", "00-baseline"], 12, "confirming round 1 of 12"),
        ("running", ["00-champion", "00-baseline", "01-champion", "01-no_speculation"], 12, "confirming round 2 of 12"),
        ("running", ["00-champion"], None, "confirming round 1"),
        ("finished", ["00-champion"], 12, "done"),
        ("stopped", [], 12, "done"),
    ],
)
def test_phase(tmp_path: Path, status: str, folders: list[str], max_rounds: int | None, phase: str) -> None:
    for name in folders:
        (tmp_path / "confirm" / name).mkdir(parents=True)
    (tmp_path / "experiment.json").write_text(json.dumps({"promotion": {"max_rounds": max_rounds}}))
    assert phase_of(tmp_path, status) == phase


def test_live_line_shows_done_in_flight_best_eta_and_phase() -> None:
    live = LiveProgress(budget=10, objective="decode_tok_s")
    live.on(st.ExecutorReady(address="x", gpus=16, slots=2), 0.0)
    for n in (1, 2):
        live.on(st.TrialLaunched(number=n, role="search", params={}), 0.0)
    done = TrialOutcome(
        number=1,
        params={},
        role=TrialRole.search,
        status=TrialStatus.COMPLETE,
        metrics=Metrics(decode_tok_s=72.57, output_tok_s=72.57),
        started_at=100.0,
        finished_at=160.0,
    )
    live.on(st.TrialFinished(outcome=done, speedup=1.2), 60.0)
    assert live.line(75.0) == "search · 1/10 done · in flight #2 75s · best 72.6 decode_tok_s · ETA 4 min"
    live.on(st.ConfirmationRun(round=2, of=12, who="champion"), 80.0)
    assert live.line(80.0).startswith("confirmation round 2 of 12 · 1/10 done")
    assert "ETA" not in live.line(80.0), "no search ETA once confirming"
