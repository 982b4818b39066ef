"""A start that fails leaves a state that says failed and why, no empty study, and no secret on disk:
the same command works again once the cause is fixed (real Optuna sqlite storage, real MLflow client)."""

from __future__ import annotations

import json
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import optuna
import pytest
from e2e_helpers import demo_experiment, served_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.errors import StorageWriteError, SweepToolError, TrackingError
from orchestrator.execute.inline import InlineExecutor
from orchestrator.sweep.driver import Sweep
from orchestrator.sweep.state import TrialFinished


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
    state = json.loads((wd / "sweep.json").read_text())  # a start that failed in open() used to write none
    assert state["status"] == "failed" and state["stop_kind"] == "start_failed"
    assert "MLflow" in state["stop_reason"] and "hunter2" not in state["stop_reason"]
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


def test_a_study_left_by_a_start_killed_before_its_parent_run_is_taken_over(
    tmp_path: Path, sqlite_store_template: Path
) -> None:
    spec = spec_mod.load(write_experiment(tmp_path, demo_experiment(name="killedstart")))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    left = optuna.create_study(study_name="killedstart", storage=f"sqlite:///{wd / 'optuna.db'}")
    left.set_user_attr("sweep_started_at", 1.0)  # killed after this, before the MLflow parent run
    sweep = Sweep(spec, wd, executor=InlineExecutor(1))
    sweep.open()  # the same command, no --resume
    assert sweep.parent_run_id is not None
    assert json.loads((wd / "sweep.json").read_text())["status"] == "running"


def _answers_empty_json() -> tuple[ThreadingHTTPServer, str]:
    """An HTTP server on loopback that answers `{}` with 200 to every request (the issue's 'MLflow')."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def test_an_mlflow_that_answers_empty_json_is_one_message_and_sweep_json_says_failed(tmp_path: Path) -> None:
    """It used to open a parent run with the id '' and fail at trial 0's run, leaving sweep.json `running`."""
    server, uri = _answers_empty_json()
    try:
        spec = spec_mod.load(write_experiment(tmp_path, demo_experiment(name="emptyjson", tracking={"uri": uri})))
        wd = tmp_path / "wd"
        with pytest.raises(TrackingError) as err:
            Sweep(spec, wd, executor=InlineExecutor(1)).run()
    finally:
        server.shutdown()
        server.server_close()
    assert f"MLflow at {uri} opened the sweep's run without giving its id" in str(err.value)
    state = json.loads((wd / "sweep.json").read_text())
    assert state["status"] == "failed" and state["stop_kind"] == "start_failed"
    assert "without giving its id" in state["stop_reason"] and state["launched"] == 0
    assert _studies(wd) == []  # the same command starts once tracking.uri is fixed


def test_a_storage_failure_mid_sweep_leaves_sweep_json_failed_and_resume_finishes(
    tmp_path: Path, sqlite_store_template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Optuna storage refuses writes after the first trial finished (another connection holds the
    database locked, as a full disk refuses them): the driver's one StorageWriteError, sweep.json says
    `failed` and why (it used to stay `running`), the measured trial is kept, and --resume finishes."""
    spec = spec_mod.load(
        write_experiment(
            tmp_path,
            served_experiment(
                name="midfail",
                budget={"trials": 3, "concurrent_trials": 1},  # the gate's pair only: the storage is the subject
                promotion={"min_rounds": 3, "max_rounds": 3, "min_gain": 0.0, "explain": False, "concurrency": [1]},
            ),
        )
    )
    from orchestrator.search import study as study_mod

    monkeypatch.setattr(study_mod, "SQLITE_BUSY_S", 2.0)  # the lock is held to the end: wait 2 s for it, not 30
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)  # an MLflow store already migrated
    holder: list[sqlite3.Connection] = []

    def lock_after_first_trial(event: object) -> None:
        if isinstance(event, TrialFinished) and not holder:
            db = sqlite3.connect(wd / "optuna.db", timeout=30)
            db.execute("BEGIN EXCLUSIVE")
            holder.append(db)

    try:
        with pytest.raises(StorageWriteError):
            Sweep(spec, wd, executor=InlineExecutor(1), on_event=lock_after_first_trial).run()
    finally:
        for db in holder:
            db.rollback()
            db.close()
    assert holder, "no trial finished before the lock"
    state = json.loads((wd / "sweep.json").read_text())
    assert state["status"] == "failed" and state["stop_kind"] == "failed", state
    assert "--resume" in state["stop_reason"]
    study = optuna.load_study(study_name="midfail", storage=f"sqlite:///{wd / 'optuna.db'}")
    kept = [t.number for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert kept, [t.state for t in study.trials]
    summary = Sweep(spec, wd, executor=InlineExecutor(1), resume=True).run()
    assert json.loads((wd / "sweep.json").read_text())["status"] == "finished"
    done = optuna.load_study(study_name="midfail", storage=f"sqlite:///{wd / 'optuna.db'}").trials
    assert all(done[n].values == study.trials[n].values for n in kept)  # nothing measured is lost
    assert summary.launched >= len(kept)


def test_a_resume_that_cannot_start_says_so_in_sweep_json_and_keeps_the_earlier_run(
    tmp_path: Path, sqlite_store_template: Path
) -> None:
    """--resume while MLflow is down (tracking.uri at a closed port): sweep.json used to stay as the
    earlier run left it (`finished`), as if nothing had been tried. Now it says the resume failed and why,
    and keeps the earlier run's counts, best, baselines and why it stopped; the study is untouched, and
    the same --resume, once MLflow is back, continues it (real Optuna and MLflow sqlite stores)."""
    from orchestrator.testing import ModelExecutor

    data = demo_experiment(name="resumefail", budget={"trials": 2, "concurrent_trials": 1}, promotion={"max_rounds": 0})
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    Sweep(spec, wd, executor=ModelExecutor(1)).run()
    earlier = json.loads((wd / "sweep.json").read_text())
    assert earlier["status"] == "finished" and earlier["complete"] == 2
    trials = optuna.load_study(study_name="resumefail", storage=f"sqlite:///{wd / 'optuna.db'}").trials

    down = spec_mod.load(
        write_experiment(tmp_path, {**data, "tracking": {"uri": "http://127.0.0.1:9"}}, name="down.yaml")
    )
    with pytest.raises(SweepToolError, match="MLflow"):
        Sweep(down, wd, executor=ModelExecutor(1), resume=True, n_trials=3).run()
    state = json.loads((wd / "sweep.json").read_text())
    assert state["status"] == "failed" and state["stop_kind"] == "start_failed"
    assert state["stop_reason"].startswith("the --resume could not start: ")
    assert "MLflow" in state["stop_reason"]
    assert earlier["stop_reason"] and earlier["stop_reason"] in state["stop_reason"]  # why the earlier run stopped
    kept = {k: v for k, v in state.items() if k not in {"status", "stop_kind", "stop_reason", "pid", "updated_at"}}
    assert kept == {k: v for k, v in earlier.items() if k in kept}  # counts, best, baselines, schedule
    again = optuna.load_study(study_name="resumefail", storage=f"sqlite:///{wd / 'optuna.db'}").trials
    assert [(t.number, t.state, t.values) for t in again] == [(t.number, t.state, t.values) for t in trials]

    summary = Sweep(spec, wd, executor=ModelExecutor(1), resume=True, n_trials=3).run()
    state = json.loads((wd / "sweep.json").read_text())
    assert state["status"] == "finished" and state["complete"] == 3 and summary.launched == 3
