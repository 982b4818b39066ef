"""A start that fails leaves a state that says failed and why, no empty study, and no secret on disk:
the same command works again once the cause is fixed (real Optuna sqlite storage, real MLflow client)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.errors import SweepToolError
from orchestrator.execute.inline import InlineExecutor
from orchestrator.sweep.driver import Sweep


def _studies(wd: Path) -> list[str]:
    return optuna.study.get_all_study_names(storage=f"sqlite:///{wd / 'optuna.db'}")


def test_mlflow_down_leaves_no_study_and_no_password(tmp_path: Path) -> None:
    data = demo_experiment(name="downstart", tracking={"uri": "http://bob:hunter2@127.0.0.1:9"})
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    messages = []
    for _ in range(2):  # the second start meets the same cause, not "already holds a sweep"
        with pytest.raises(SweepToolError) as err:
            Sweep(spec, wd, executor=InlineExecutor(1)).run()
        messages.append(str(err.value))
        assert _studies(wd) == []
    assert "MLflow" in messages[1] and "--resume" not in messages[1]
    for path in wd.rglob("*"):
        if path.is_file():
            assert b"hunter2" not in path.read_bytes(), path
    written = json.loads((wd / "experiment.json").read_text())
    assert written["tracking"]["uri"] == "http://bob:***@127.0.0.1:9"


@pytest.mark.slow
def test_a_failed_preflight_check_says_failed_and_the_same_command_starts_again(tmp_path: Path) -> None:
    from orchestrator.execute.ray_actor import RayExecutor

    spec = spec_mod.load(write_experiment(tmp_path, demo_experiment(name="preflight")))
    wd = tmp_path / "wd"
    too_small = RayExecutor(tp=spec.server.tp, concurrent=1, logical_gpus=spec.server.tp // 2)
    with pytest.raises(SweepToolError, match="GPUs but one trial needs server.tp"):
        Sweep(spec, wd, executor=too_small).run()
    state = json.loads((wd / "sweep.json").read_text())
    assert state["status"] == "failed" and state["stop_kind"] == "start_failed"
    assert "GPUs but one trial needs server.tp" in state["stop_reason"]
    assert _studies(wd) == []
    Sweep(spec, wd, executor=InlineExecutor(1)).open()  # no --resume needed: nothing ran
    assert _studies(wd) == ["preflight"]


def test_a_study_left_by_a_start_killed_before_its_parent_run_is_taken_over(tmp_path: Path,
                                                                            sqlite_store_template: Path) -> None:
    spec = spec_mod.load(write_experiment(tmp_path, demo_experiment(name="killedstart")))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    left = optuna.create_study(study_name="killedstart", storage=f"sqlite:///{wd / 'optuna.db'}")
    left.set_user_attr("sweep_started_at", 1.0)  # killed after this, before the MLflow parent run
    sweep = Sweep(spec, wd, executor=InlineExecutor(1))
    sweep.open()  # the same command, no --resume
    assert sweep.parent_run_id is not None
    assert json.loads((wd / "sweep.json").read_text())["status"] == "running"
