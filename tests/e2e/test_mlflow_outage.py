"""MLflow goes away mid-sweep: a real lean `mlflow server` is the tracking URI and is stopped (its
whole process group) after two trials. The sweep keeps its pace, results queue in the work
directory's outbox, the server comes back on the same port and store, and in the end MLflow holds
one child run per trial with its metrics and the champion alias resolves."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from e2e_helpers import served_experiment, start_sweep, sweep, trial_files, wait_for, wait_until_gone, write_experiment
from mlflow.tracking import MlflowClient
from mlflow_fixtures import MlflowServer, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.search.study import read_only

pytestmark = pytest.mark.slow

MAX_GAP_S = 5.0
"""A slot freed by a finished trial gets its next trial within this long, MLflow up or down."""


def _outbox_lines(wd) -> int:
    path = wd / "outbox.jsonl"
    return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.exists() else 0


def _launch_gaps(outcomes: dict[int, dict], since: float) -> list[tuple[int, float]]:
    """For each trial that finished after `since`: seconds until the next trial started (its slot refilled)."""
    gaps = []
    for n, o in outcomes.items():
        if o["finished_at"] < since:
            continue
        later = [x["started_at"] for x in outcomes.values() if x["started_at"] >= o["finished_at"]]
        if later:
            gaps.append((n, min(later) - o["finished_at"]))
    return gaps


def test_mlflow_down_mid_sweep_results_wait_in_the_outbox_and_reach_mlflow_later(tmp_path, sqlite_store_template):
    server = MlflowServer(tmp_path / "mlflow-server", store_template=sqlite_store_template)
    server.start()
    try:
        budget = 8
        data = served_experiment(
            name="outage",
            budget={"trials": budget, "concurrent_trials": 2},
            benchmark={"repeats": 2},
            promotion={"max_rounds": 0, "min_gain": 0.0},
            tracking={"uri": server.uri},
        )
        exp, wd, marker, log = write_experiment(tmp_path, data), tmp_path / "wd", uuid.uuid4().hex, tmp_path / "run.log"
        proc = start_sweep(exp, wd, marker, log)
        try:
            wait_for(lambda: len(trial_files(wd)[0]) >= 2, proc, log)
            server.stop()
            stopped_at = time.time()
            finished_before = set(trial_files(wd)[0])
            wait_for(
                lambda: len(set(trial_files(wd)[0]) - finished_before) >= 2 and _outbox_lines(wd) >= 2,
                proc,
                log,
                timeout_s=180,
            )
            queued = _outbox_lines(wd)
            server.start()  # same port, same store
            rc = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        text = log.read_text()
        assert rc == 0, text
        assert "Traceback" not in text
        assert queued >= 2

        # The sweep did not stall while MLflow was down: every freed slot was refilled promptly.
        outcomes, _ = trial_files(wd)
        gaps = _launch_gaps(outcomes, since=stopped_at)
        assert gaps and max(g for _, g in gaps) < MAX_GAP_S, gaps

        # What waited was sent (by the sweep itself when MLflow answered again); `sweep sync` finds nothing left.
        synced = sweep("sync", "--workdir", str(wd))
        assert synced.returncode == 0, synced.stdout + synced.stderr
        assert "0 still pending" in synced.stdout

        client = MlflowClient(tracking_uri=server.uri)
        experiment = client.get_experiment_by_name("outage")
        runs = client.search_runs([experiment.experiment_id], max_results=1000)
        children: dict[int, list] = {}
        for r in runs:
            if r.data.tags.get("sweep.kind") == "trial" and r.data.tags.get("sweep.role") in ("search", "baseline"):
                children.setdefault(int(r.data.tags["sweep.trial_number"]), []).append(r)
        trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", "outage")
        measured = [t for t in trials if t.state in ("COMPLETE", "FAIL") and not t.attrs.get("skipped")]
        assert len(measured) == budget
        assert sorted(children) == sorted(t.number for t in measured)
        for t in measured:
            assert len(children[t.number]) == 1, t.number
            run = children[t.number][0]
            if t.state == "COMPLETE":
                assert run.info.status == "FINISHED"
                # MLflow shows 4 significant digits; outcome.json keeps the full measurement.
                assert run.data.metrics["decode_tok_s"] == pytest.approx(
                    outcomes[t.number]["metrics"]["decode_tok_s"], rel=1e-3
                )

        summary = json.loads((wd / "summary.json").read_text())
        assert summary["promoted"], summary.get("verdict")
        version = client.get_model_version_by_alias("sglang-sweep-demo", "champion")
        assert version.run_id == children[summary["champion"]["number"]][0].info.run_id
        exported = sweep("export", "--workdir", str(wd), "--format", "env", "-o", str(tmp_path / "champion.env"))
        assert exported.returncode == 0, exported.stderr
        assert wait_until_gone(marker) == {}
    finally:
        server.stop()
