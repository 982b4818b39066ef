"""What a user writes comes back from the work directory (issue 21, item 5): experiment.json keeps every
environment value as the string a rank receives, and every later reader (status, report, export, resume)
reads it back. An integer knob written as an integer (NCCL_BUFFSIZE: 16777216) passed validate and ran, but
its stored string failed the integer check on the way back: 'written by another version of sweep'."""

from __future__ import annotations

import json

import pytest
import yaml
from e2e_helpers import REPO, demo_experiment, write_experiment
from mlflow_fixtures import sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.errors import SpecError

# Every value type an experiment may give server.env: an integer for an integer knob, a power of two,
# a zero, an integer for a 0/1 knob, an integer written as a string, an integer for a variable without a knob.
ENV = {
    "NCCL_BUFFSIZE": 16777216,
    "NCCL_P2P_DISABLE": 0,
    "NCCL_MAX_CTAS": 16,
    "SGLANG_HEALTH_CHECK_TIMEOUT": "60",
    "NCCL_NTHREADS": 256,
    "NCCL_DEBUG": "INFO",
}
FLAGS = {
    "mem-fraction-static": 0.85,
    "enable-metrics": True,
    "cuda-graph-max-bs-decode": 8,
    "attention-backend": "triton",
    "chunked-prefill-size": -1,
}


def experiment(tmp_path, name: str = "roundtrip", **overrides):
    nccl = tmp_path / "nccl-no-ll128.yaml"  # LL128 forced on a PCIe host changes outputs (the correctness gate)
    nccl.write_text(
        yaml.safe_dump(
            {
                "name": "nccl-no-ll128",
                "params": {
                    "NCCL_PROTO": {"choices": [None, "LL", "Simple"]},
                    "NCCL_ALGO": {"choices": [None, "Ring", "Tree"]},
                },
            }
        )
    )
    space = [str(nccl), str(REPO / "search_spaces" / "eagle3.yaml")]
    data = demo_experiment(name=name, search_space=space, **overrides)
    data["server"]["env"].update(ENV)
    data["server"]["flags"] = dict(FLAGS)
    return data


def test_every_value_type_reads_back_from_experiment_json(tmp_path):
    spec = spec_mod.load(write_experiment(tmp_path, experiment(tmp_path)))
    stored = json.loads(json.dumps(spec.model_dump(mode="json")))
    assert stored["server"]["env"]["NCCL_BUFFSIZE"] == "16777216"  # what the ranks receive
    back = spec_mod.SweepSpec.model_validate(stored)
    assert back == spec
    assert back.server.flags == FLAGS and type(back.server.flags["cuda-graph-max-bs-decode"]) is int


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("NCCL_BUFFSIZE", "16M", "NCCL_BUFFSIZE must be an integer, but got '16M'"),
        ("NCCL_BUFFSIZE", "3000000", "must be a positive power of two, but got 3000000"),
        ("NCCL_MAX_CTAS", "65", "must be in [1, 64], but got 65"),
        ("NCCL_P2P_DISABLE", True, "must be a string or an integer, but got True"),
        ("NCCL_BUFFSIZE", 1.5, "must be a string or an integer, but got 1.5"),
    ],
)
def test_a_value_that_cannot_round_trip_is_refused_at_validate(tmp_path, name, value, message):
    data = experiment(tmp_path)
    data["server"]["env"][name] = value
    with pytest.raises(SpecError) as err:
        spec_mod.load(write_experiment(tmp_path, data))
    assert message in str(err.value) and name in str(err.value)


def _mlflow_speedups(wd, name: str) -> dict[int, float | None]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`sweep.kind` = 'trial'", max_results=1000)
    return {
        int(r.data.tags["sweep.trial_number"]): r.data.metrics.get("speedup_pct")
        for r in runs
        if r.data.tags.get("sweep.role") != "confirm"
    }


def _parent(wd, name: str, tmp_path) -> tuple[dict[int, float | None], dict[str, float]]:
    """(trial -> speedup_pct of the parent run's results.csv, the parent run's metrics)."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    parent = next(r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("sweep.kind") == "sweep")
    table = pd.read_csv(client.download_artifacts(parent.info.run_id, "results.csv", str(tmp_path)))
    csv = {int(t): (None if s != s else float(s)) for t, s in zip(table["trial"], table["speedup_pct"])}
    return csv, dict(parent.data.metrics)


def test_a_sweep_with_integer_env_values_reads_back_everywhere_with_one_speedup_per_trial(
    tmp_path, sqlite_store_template
):
    """A sweep on the model-backed executor with NCCL_BUFFSIZE: 16777216 in server.env, baselines measured
    again during the search and by the confirmation rounds; then `sweep status`, `sweep report`, `sweep
    export` and `sweep run --resume` through the CLI, and each trial's speed-up in every view."""
    from e2e_helpers import sweep
    from mlflow_fixtures import copy_store

    from orchestrator.sweep import publish, status
    from orchestrator.sweep.driver import Sweep
    from orchestrator.testing import ModelExecutor

    data = experiment(
        tmp_path,
        name="ints",
        budget={"trials": 10, "concurrent_trials": 2, "baseline_every": 4},
        promotion={"min_rounds": 3, "max_rounds": 4, "min_gain": 0.0},
    )
    path = write_experiment(tmp_path, data)
    spec = spec_mod.load(path)
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    summary = Sweep(spec, wd, executor=ModelExecutor(2)).run()
    assert json.loads((wd / "experiment.json").read_text())["server"]["env"]["NCCL_BUFFSIZE"] == "16777216"
    drift_baselines = summary.baseline_drift.baselines
    searched = [b for b in drift_baselines if b in status.status_report(wd).baselines]
    assert len(drift_baselines) > 2 and searched  # the search's baselines and the confirmation's

    # One figure per trial: MLflow's runs, the report's table (report.html), the parent's results.csv.
    in_mlflow = _mlflow_speedups(wd, "ints")
    page = publish.build(wd)
    in_report = {
        int(t): (None if s != s else s) for t, s in zip(page.content.table["trial"], page.content.table["speedup_pct"])
    }
    in_csv, parent_metrics = _parent(wd, "ints", tmp_path)
    measured = {n for n, v in in_mlflow.items() if v is not None}
    assert len(measured) >= 8
    assert {n: in_report[n] for n in measured} == {n: in_mlflow[n] for n in measured}
    assert {n: in_csv[n] for n in measured} == {n: in_mlflow[n] for n in measured}
    best = status.status_report(wd).best
    assert best is not None and best.speedup_pct == in_mlflow[best.number]
    # The parent run's figures: 4 significant digits, the gate's bounds named as such.
    from orchestrator.tracking import convert

    assert parent_metrics["confirmed_decode_tok_s"] == convert.rounded(summary.confirmed.champion_median)
    assert all(value == convert.rounded(value) for value in parent_metrics.values())
    assert {"champion_gain_gate_low_pct", "champion_gain_gate_high_pct"} <= set(parent_metrics)
    assert not any("ci95" in name for name in parent_metrics)

    # The CLI's readers: status, report, export, resume.
    shown = sweep("status", "--workdir", str(wd))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert (
        f"trial {best.number}: decode_tok_s = {best.value:.2f} ({best.speedup_pct:+.1f}% vs baseline)" in shown.stdout
    )
    assert f"({len(drift_baselines)} measurement(s))" in shown.stdout  # every baseline measured, as the drift
    reported = sweep("report", "--workdir", str(wd))
    assert reported.returncode == 0 and "warning" not in reported.stderr, reported.stdout + reported.stderr
    assert "report.html" in reported.stdout and (wd / "report.html").is_file()
    env_file = tmp_path / "champion.env"
    exported = sweep("export", "--workdir", str(wd), "--format", "env", "-o", str(env_file))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    from orchestrator.results import export as export_mod

    assert export_mod.parse_env(env_file.read_text())["NCCL_BUFFSIZE"] == "16777216"
    resumed = sweep("run", str(path), "--workdir", str(wd), "--resume")
    assert resumed.returncode in (0, 3), resumed.stdout + resumed.stderr
    assert "another version" not in resumed.stdout + resumed.stderr
    assert "already decided" in resumed.stdout + resumed.stderr + (wd / "summary.json").read_text()
