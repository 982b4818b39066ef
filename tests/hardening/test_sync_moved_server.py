"""Issue 38: `sweep sync --tracking-uri URI` sends what the outbox holds to an MLflow server that moved to
another port since the sweep recorded its address, with a real MLflow server on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow_fixtures import MlflowServer, sqlite_store_template  # noqa: F401 - a fixture, requested by name
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.tracking.outbox import OUTBOX_FILE, EndSweep, render_line


@pytest.mark.slow
def test_sync_replays_to_the_server_where_it_is_now(tmp_path: Path, sqlite_store_template: Path) -> None:  # noqa: F811
    from mlflow.tracking import MlflowClient

    old = MlflowServer(tmp_path / "server", store_template=sqlite_store_template)
    old.start()
    try:
        client = MlflowClient(tracking_uri=old.uri)
        experiment = client.create_experiment("moved")
        parent = client.create_run(experiment).info.run_id
    finally:
        old.stop()
    moved = MlflowServer(tmp_path / "server")  # the same store, another port
    moved.start()
    try:
        wd = tmp_path / "wd"
        wd.mkdir()
        state = {"experiment": "moved", "status": "finished", "tracking_uri": old.uri, "mlflow_experiment": "moved"}
        (wd / "sweep.json").write_text(json.dumps(state))
        (wd / OUTBOX_FILE).write_text(render_line(EndSweep(parent_run_id=parent, status="FINISHED")) + "\n")

        stale = CliRunner().invoke(app, ["sync", "--workdir", str(wd)])
        assert stale.exit_code != 0 and MlflowClient(tracking_uri=moved.uri).get_run(parent).info.status == "RUNNING"

        result = CliRunner().invoke(app, ["sync", "--workdir", str(wd), "--tracking-uri", moved.uri])
        assert result.exit_code == 0, result.output
        assert f"replayed 1 result(s) to {moved.uri}; 0 still pending" in " ".join(result.output.split())
        assert MlflowClient(tracking_uri=moved.uri).get_run(parent).info.status == "FINISHED"
    finally:
        moved.stop()
