"""The verdict survives an unreadable summary.json: the study keeps the promotion's outcome, so a
--resume of a decided sweep neither confirms nor registers again (issue 23, item 4). In-process
(loop_helpers' CountingExecutor, real Optuna and MLflow sqlite stores)."""

from __future__ import annotations

import pytest
from e2e_helpers import write_experiment
from loop_helpers import CountingExecutor, experiment
from mlflow import MlflowClient
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)
from typer.testing import CliRunner

from orchestrator import cli
from orchestrator.config import experiment as spec_mod
from orchestrator.results import export
from orchestrator.search.study import read_only
from orchestrator.sweep import _decided
from orchestrator.sweep import state as st
from orchestrator.sweep.driver import Sweep


@pytest.mark.parametrize("damage", ["garbage", "missing"])
def test_resume_with_summary_json_unreadable_registers_nothing_again(tmp_path, sqlite_store_template, damage):
    data = experiment(tmp_path, steps=3, min_gain=0.05, explain=False, min_rounds=3, max_rounds=4)
    data["budget"]["trials"] = 3
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    first = Sweep(spec, wd, executor=CountingExecutor(2)).run()
    assert first.outcome is not None and first.outcome is not st.Outcome.no_champion, first.verdict
    _, attrs = read_only(f"sqlite:///{wd / 'optuna.db'}", spec.name) or ([], {})
    kept = attrs[_decided.DECISION_ATTR]
    assert kept["outcome"] == first.outcome.value and kept["model_version"] == first.model_version

    if damage == "garbage":
        (wd / "summary.json").write_text('{"workdir": ')  # cut short mid-write
    else:
        (wd / "summary.json").unlink()
    again = CountingExecutor(2)
    resumed = Sweep(spec, wd, executor=again, resume=True).run()
    assert again.submitted == [], "no trial and no confirmation round measured again"
    assert resumed.outcome is first.outcome and resumed.promoted == first.promoted
    assert resumed.model_version == first.model_version
    assert "already decided before this --resume" in (resumed.verdict or "")
    versions = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}").search_model_versions(
        f"name='{spec.promotion.model_name}'"
    )
    assert len(versions) == (1 if first.promoted else 0)
    assert st.SweepSummary.model_validate_json((wd / "summary.json").read_text()).outcome is first.outcome
    if first.promoted:  # what was registered the first time is what `sweep export` writes
        out = tmp_path / "c.env"
        result = CliRunner().invoke(cli.app, ["export", "--workdir", str(wd), "-o", str(out)])
        assert result.exit_code == 0, result.output
        assert f"trial {(first.champion or {}).get('number')}, run {first.run_id}" in " ".join(result.output.split())
        assert export.parse_env(out.read_text()) == export.parse_env((wd / "champion.env").read_text())
