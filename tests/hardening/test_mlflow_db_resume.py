"""A damaged mlflow.db under `--resume` (issue 23): the work directory's own MLflow store cut short, emptied,
replaced with garbage or the wrong JSON type, or made a directory. The real driver resumes a finished,
promoted sweep (inline executor, simulator servers, real Optuna and MLflow sqlite files): it stops with one
SweepToolError before it changes anything, the study keeps every trial, and nothing is registered twice."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import optuna
import pytest
from e2e_helpers import served_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.errors import SweepToolError
from orchestrator.execute.inline import InlineExecutor
from orchestrator.sweep.driver import Sweep

DAMAGES = ["truncate", "empty", "garbage", "wrong_type", "directory"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, sqlite_store_template: Path) -> tuple[Path, spec_mod.SweepSpec]:
    tmp = tmp_path_factory.mktemp("mlflowdb-template")
    spec = spec_mod.load(
        write_experiment(
            tmp,
            served_experiment(
                name="mlflowdb",
                budget={"trials": 2, "concurrent_trials": 1},
                promotion={"min_rounds": 3, "max_rounds": 3, "min_gain": 0.0, "explain": False, "concurrency": [1]},
            ),
        )
    )
    wd = tmp / "wd"
    copy_store(sqlite_store_template, wd)  # an MLflow store already migrated
    Sweep(spec, wd, executor=InlineExecutor(1)).run()
    return wd, spec


def _damage(db: Path, how: str) -> None:
    data = db.read_bytes()
    if how == "truncate":
        db.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        db.write_bytes(b"")
    elif how == "garbage":
        db.write_bytes(b"\x00\xffnot a database" * 300)
    elif how == "wrong_type":
        db.write_text(json.dumps([1, "x", {"pid": 1}]))
    elif how == "directory":
        db.unlink()
        (db / "inside").mkdir(parents=True)


def _trials(wd: Path, name: str) -> list[tuple[int, str, tuple[float, ...] | None]]:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{wd / 'optuna.db'}")
    return [(t.number, t.state.name, tuple(t.values) if t.values else None) for t in study.trials]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_mlflow_db_under_resume_is_one_message_and_changes_nothing(
    finished, tmp_path: Path, how: str
) -> None:
    template, spec = finished
    wd = tmp_path / f"wd-{how}"  # a new path per case: MLflow keeps one engine per database path
    shutil.copytree(template, wd)
    before_trials = _trials(wd, spec.name)
    before_state = (wd / "sweep.json").read_bytes()
    _damage(wd / "mlflow.db", how)
    with pytest.raises(SweepToolError) as err:
        Sweep(spec, wd, executor=InlineExecutor(1), resume=True).run()
    text = str(err.value)
    assert err.value.exit_code in (1, 2)
    assert "\n" not in text.strip() and "Traceback" not in text
    assert str(wd / "mlflow.db") in text, text
    assert _trials(wd, spec.name) == before_trials  # nothing measured again, nothing lost
    assert (wd / "sweep.json").read_bytes() == before_state  # a refusal before the start changes no record
    if (wd / "mlflow.db").is_file() and how != "empty":
        with pytest.raises(sqlite3.DatabaseError):  # the damage is still there: nothing recreated a store over it
            sqlite3.connect(wd / "mlflow.db").execute("select count(*) from model_versions").fetchone()
