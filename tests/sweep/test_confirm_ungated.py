"""Without a gate (promotion.max_rounds: 0) the search-phase champion is promoted only when its one
measurement shows promotion.min_gain over the baseline's (issue 23, item 6). In-process (loop_helpers'
CountingExecutor, real Optuna and MLflow sqlite stores)."""

from __future__ import annotations

from loop_helpers import experiment, run_sweep
from mlflow import MlflowClient
from mlflow_fixtures import sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.sweep import state as st


def test_no_gate_refuses_a_champion_below_min_gain_saying_the_figures(tmp_path, sqlite_store_template):
    # NCCL_P2P_LEVEL=SYS and EAGLE-3 give about +60% on the simulated PCIe host: not the +150% asked for.
    data = experiment(tmp_path, steps=3, max_rounds=0, min_gain=1.5)
    data["budget"]["trials"] = 3
    wd, summary, _, events = run_sweep(tmp_path, sqlite_store_template, data)
    assert not [e for e in events if isinstance(e, st.ConfirmationRun)]
    assert summary.outcome is st.Outcome.not_better and not summary.promoted, summary.verdict
    verdict = summary.verdict or ""
    assert verdict.startswith("not better: promotion.max_rounds is 0"), verdict
    assert summary.champion is not None and summary.confirmed is not None
    assert f"{summary.confirmed.champion_median:.2f} vs baseline {summary.confirmed.baseline_median:.2f}" in verdict
    assert "below the required +150.0% (promotion.min_gain)" in verdict
    assert summary.confirmed.label == "unconfirmed" and summary.confirmed.gain < 1.5
    assert not (wd / "champion.env").exists() and summary.model_version is None
    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    assert client.search_model_versions("name='sglang-sweep-demo'") == []
