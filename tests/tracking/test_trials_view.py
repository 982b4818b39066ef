"""The experiment as MLflow's runs page opens it, on a real sqlite store read back with MlflowClient: once
the report is published, the deployed configuration's run ranks first (even where another trial measured
more in the search), every knob is a column of the shared view, and the experiment's note links the
sweep's run in the training view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixtures are used by name)
from trial_files import KNOBS, write_trial

from orchestrator.records import TrialRole
from orchestrator.tracking import convert
from orchestrator.tracking.tracker import Tracker


@pytest.fixture
def tracker(tmp_path: Path, sqlite_store_template: Path) -> Tracker:  # noqa: F811
    return Tracker(copy_store(sqlite_store_template, tmp_path), "demo", outbox_dir=tmp_path)


def test_the_deployed_run_ranks_first_and_every_knob_is_a_column(tracker: Tracker, tmp_path: Path) -> None:
    parent = tracker.start_sweep(run_name="s", params={"objective": "decode_tok_s"}, tags={})
    runs: dict[int, str] = {}
    for number, tok_s, role in ((0, 100.0, TrialRole.baseline), (1, 160.0, TrialRole.search), (2, 150.0, None)):
        outcome = write_trial(tmp_path, number, role=role or TrialRole.search, decode_tok_s=tok_s)
        tracker.log_trial(parent, outcome, extra_metrics={})
        run_id = tracker.find_trial(parent, number, (role or TrialRole.search).value)
        assert run_id is not None
        runs[number] = run_id
    report = tmp_path / "report.html"
    report.write_text("<html></html>")
    # The verdict deployed trial 2 (trial 1 measured more once in the search, and lost the confirmation).
    tracker.publish_report(
        parent, description="d", report=report, plots={}, plotly_js="", champion_trial=2, star_run_id=runs[2]
    )
    client = MlflowClient(tracker.tracking_uri)
    rank = {n: client.get_run(r).data.metrics[convert.RANK_METRIC] for n, r in runs.items()}
    assert rank == {2: 1.0, 1: 2.0, 0: 3.0}
    experiment = client.get_experiment(tracker.experiment_id())
    view = json.loads(experiment.tags[convert.SHARED_VIEW_TAG + convert.TRIALS_VIEW_KEY])
    assert view["orderByKey"] == f"metrics.`{convert.RANK_METRIC}`" and view["orderByAsc"] is True
    assert {f"params.`{k}`" for k in KNOBS} <= set(view["selectedColumns"])
    # What the runs page asks MLflow for returns the deployed run first.
    top = client.search_runs(
        [tracker.experiment_id()], view["searchFilter"], order_by=[f"metrics.`{convert.RANK_METRIC}` ASC"]
    )
    assert top[0].info.run_id == runs[2]
    note = experiment.tags[convert.NOTE_TAG]
    assert f"runs/{parent}?workflowType=machine_learning" in note, "the note links the sweep's run"
