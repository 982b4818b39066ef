"""The parent run's results table: the objective's speed-up in the objective's direction, and the
Pareto front column when the experiment has two objectives."""

from __future__ import annotations

import pytest
from report_helpers import outcome, spec

from orchestrator.records import TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import report, report_html

_outcome = outcome
_spec = spec


def test_speedup_follows_the_objective_and_its_direction():
    outcomes = [_outcome(0, TrialRole.baseline, 60.0, 50.0, 100.0), _outcome(1, TrialRole.search, 90.0, 40.0, 110.0)]
    baselines = [(100.0, 1000 / 60.0)]
    table = report.results_table(_spec(metric="cycle_ms", direction="minimize"), outcomes, baselines)
    # cycle time fell from 16.7 ms to 11.1 ms: 1.5x better, whatever the unit's direction
    assert table.loc[table.trial == 1, "speedup_pct"].item() == pytest.approx(50.0)
    assert "pareto_front" not in table


def test_pareto_front_column_with_two_objectives():
    outcomes = [
        _outcome(0, TrialRole.baseline, 60.0, 50.0, 100.0),
        _outcome(1, TrialRole.search, 90.0, 40.0, 110.0),  # fast and quick to first token
        _outcome(2, TrialRole.search, 95.0, 70.0, 120.0),  # fastest, slower first token
        _outcome(3, TrialRole.search, 80.0, 60.0, 130.0),
    ]  # dominated by 1
    spec = _spec(secondary="ttft_ms_p99", secondary_direction="minimize")
    table = report.results_table(spec, outcomes, [(100.0, 60.0)])
    assert dict(zip(table.trial, table.pareto_front)) == {0: False, 1: True, 2: True, 3: False}
    assert set(report.figures(spec, outcomes, [(100.0, 60.0)])) == {"objective_by_trial.png", "pareto_front.png"}


def test_table_ranks_by_the_objective_marks_the_champion_and_leaves_confirmations_out():
    outcomes = [
        _outcome(0, TrialRole.baseline, 60.0, 50.0, 100.0),
        _outcome(1, TrialRole.search, 90.0, 40.0, 110.0),
        _outcome(2, TrialRole.search, 70.0, 40.0, 120.0),
        _outcome(2, TrialRole.confirm, 99.0, 40.0, 130.0),
        TrialOutcome(
            number=3,
            params={"NCCL_PROTO": "LL"},
            role=TrialRole.search,
            status=TrialStatus.FAILED,
            reason="boom",
            started_at=1,
            finished_at=2,
        ),
    ]
    table = report.results_table(_spec(), outcomes, [(100.0, 60.0)])
    assert list(table.trial) == [1, 2, 0, 3], "best decode tok/s first, the failure last"
    assert list(table.champion) == ["★", "", "", ""]
    assert list(table.role).count("confirm") == 0
    best = table.set_index("trial").best_so_far
    assert (best[1], best[2], best[3]) == (90.0, 90.0, 90.0), "the best searched value up to each trial"


def test_parent_metrics_in_percent_and_no_interval_without_one():
    summary = {"complete": 3, "failed": 0, "skipped": 2, "gate": {"gain": 0.1234, "ci_low": 0.1234, "ci_high": 0.1234}}
    metrics = report.parent_metrics(summary, [])
    assert metrics["champion_gain_pct"] == 12.3
    assert not set(report.GATE_BOUNDS) & set(metrics), "a zero-width interval is no interval"


def test_the_gates_bounds_are_named_as_the_gates_not_as_a_95_percent_interval():
    summary = {"complete": 3, "failed": 0, "skipped": 0, "gate": {"gain": 0.1234, "ci_low": 0.0412, "ci_high": 0.2101}}
    metrics = report.parent_metrics(summary, [])
    assert (metrics["champion_gain_gate_low_pct"], metrics["champion_gain_gate_high_pct"]) == (4.1, 21.0)
    assert not any("ci95" in name for name in metrics), "the gate's bounds are at 1 - 0.05/looks each side, not 95%"


def test_report_page_answers_which_how_much_and_why_before_the_table():
    table = report.results_table(
        _spec(),
        [_outcome(0, TrialRole.baseline, 60.0, 50.0, 100.0), _outcome(1, TrialRole.search, 90.0, 40.0, 110.0)],
        [(100.0, 60.0)],
    )
    page = report_html.render(
        report_html.ReportInput(
            experiment="demo",
            objective="decode_tok_s",
            direction="maximize",
            table=table,
            champion_trial=1,
            champion_params={"NCCL_PROTO": "LL"},
            champion_value=90.0,
            verdict="promoted",
            promoted=True,
            gain=0.5,
            gain_low=0.4,
            gain_high=0.6,
            confirm_rounds=4,
            model="m",
            model_version="1",
            findings={"contributions": ["NCCL settings: +50.0%"]},
            importances={"NCCL_PROTO": 1.0},
            failures=[report_html.Failure(kind="oom", count=2, trial=7, reason="CUDA out of memory")],
        )
    )
    top = page[: page.index('id="trials"')]
    for needed in (
        "trial 1",
        "+50.0%",
        "gate bounds +40.0% to +60.0%",
        "NCCL settings: +50.0%",
        "NCCL_PROTO=LL",
        "version 1",
        "oom",
    ):
        assert needed in top, needed
    assert page.index('id="champion"') < page.index('id="history"') < page.index('id="trials"')
