"""The parent run's results table: the objective's speed-up in the objective's direction, and the
Pareto front column when the experiment has two objectives."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import experiment as spec_mod
from orchestrator.records import Metrics, TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import report

DEMO = Path(__file__).resolve().parents[2] / "experiments" / "demo.yaml"


def _outcome(number: int, role: TrialRole, tok_s: float, ttft_p99: float, t: float) -> TrialOutcome:
    return TrialOutcome(number=number, params={"NCCL_PROTO": None}, role=role, status=TrialStatus.COMPLETE,
                        metrics=Metrics(decode_tok_s=tok_s, output_tok_s=tok_s, ttft_ms_p99=ttft_p99,
                                        cycle_ms=1000 / tok_s),
                        started_at=t - 5, finished_at=t)


def _spec(**objective) -> spec_mod.SweepSpec:
    base = spec_mod.load(DEMO)
    return base.model_copy(update={"objective": base.objective.model_copy(update=objective)})


def test_speedup_follows_the_objective_and_its_direction():
    outcomes = [_outcome(0, TrialRole.baseline, 60.0, 50.0, 100.0), _outcome(1, TrialRole.search, 90.0, 40.0, 110.0)]
    baselines = [(100.0, 1000 / 60.0)]
    table = report.results_table(_spec(metric="cycle_ms", direction="minimize"), outcomes, baselines)
    # cycle time fell from 16.7 ms to 11.1 ms: 1.5x better, whatever the unit's direction
    assert table.loc[table.trial == 1, "speedup_vs_baseline"].item() == pytest.approx(1.5)
    assert "pareto_front" not in table


def test_pareto_front_column_with_two_objectives():
    outcomes = [_outcome(0, TrialRole.baseline, 60.0, 50.0, 100.0),
                _outcome(1, TrialRole.search, 90.0, 40.0, 110.0),   # fast and quick to first token
                _outcome(2, TrialRole.search, 95.0, 70.0, 120.0),   # fastest, slower first token
                _outcome(3, TrialRole.search, 80.0, 60.0, 130.0)]   # dominated by 1
    spec = _spec(secondary="ttft_ms_p99", secondary_direction="minimize")
    table = report.results_table(spec, outcomes, [(100.0, 60.0)])
    assert dict(zip(table.trial, table.pareto_front)) == {0: False, 1: True, 2: True, 3: False}
    assert set(report.figures(spec, outcomes, [(100.0, 60.0)])) == {"objective_by_trial.png", "pareto_front.png"}
