"""Ctrl-C, as a terminal sends it (SIGINT to the whole foreground process group, Ray's own processes
included): the first press lets the trials in flight finish and launches nothing more, the second
aborts them now; both exit non-zero with a message, leave no process behind and a study that
`--resume` finishes."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest

from orchestrator.study import read_only
from e2e_helpers import demo_experiment, sweep, write_experiment
from test_resume import MARKER, marked_processes, mlflow_runs, start_sweep, trial_files, wait_for, wait_until_gone

pytestmark = pytest.mark.slow


def _experiment(tmp_path, name: str, trials: int):
    data = demo_experiment(name=name, budget={"trials": trials, "concurrent_trials": 2},
                           benchmark={"repeats": 2}, promotion={"confirm_repeats": 0, "min_gain": 0.0})
    return write_experiment(tmp_path, data)


def _measured(trials) -> list:
    return [t for t in trials if t.state in ("COMPLETE", "FAIL") and not t.attrs.get("skipped")
            and t.attrs.get("failure_kind") != "interrupted"]


def _resume_finishes_the_budget(exp, wd, name: str, budget: int, marker: str) -> list:
    resumed = sweep("run", str(exp), "--workdir", str(wd), "--resume", env={MARKER: marker})
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out
    assert "Traceback" not in out
    trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", name)
    assert len(_measured(trials)) == budget
    assert not [t for t in trials if t.state in ("RUNNING", "WAITING")]
    assert json.loads((wd / "summary.json").read_text())["promoted"]
    assert wait_until_gone(marker) == {}
    return trials


def test_ctrl_c_once_finishes_the_trials_in_flight_then_resume_finishes_the_budget(tmp_path):
    exp, wd, marker, log = _experiment(tmp_path, "ctrlc", 5), tmp_path / "wd", uuid.uuid4().hex, tmp_path / "run.log"
    proc = start_sweep(exp, wd, marker, log)
    try:
        in_flight = wait_for(lambda: (lambda f, r: len(f) >= 1 and len(r) == 2 and r)(*trial_files(wd)), proc, log)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(1.0)  # a launch already under way when the signal came may still complete
        launched = set(trial_files(wd)[0]) | trial_files(wd)[1]
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 1, text
    assert "Traceback" not in text
    assert "stopping after the trials in flight (Ctrl-C again to abort them)" in text
    assert "interrupted (Ctrl-C): no new trials launched, the trials in flight finished" in text
    assert "--resume" in text
    finished, running = trial_files(wd)
    assert not running and set(finished) == launched  # nothing launched after the press
    for n in in_flight:  # the trials in flight ran to their end
        assert finished[n]["status"] == "COMPLETE", finished[n]["reason"]
    trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", "ctrlc")
    assert not [t for t in trials if t.state == "RUNNING" or t.attrs.get("failure_kind") == "interrupted"]
    assert wait_until_gone(marker) == {}

    _resume_finishes_the_budget(exp, wd, "ctrlc", 5, marker)


def test_ctrl_c_twice_aborts_the_trials_in_flight_now_and_they_are_measured_again(tmp_path):
    exp, wd, marker, log = _experiment(tmp_path, "ctrlc2", 4), tmp_path / "wd", uuid.uuid4().hex, tmp_path / "run.log"
    proc = start_sweep(exp, wd, marker, log)

    def two_servers_up():
        finished, running = trial_files(wd)
        up = {n for n in running if (wd / "trials" / f"{n:04d}" / "server.pid").exists()}
        return len(finished) >= 1 and len(up) == 2 and up
    try:
        in_flight = wait_for(two_servers_up, proc, log)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        pressed = time.monotonic()
        rc = proc.wait(timeout=60)
        took = time.monotonic() - pressed
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 1, text
    assert "Traceback" not in text
    assert "aborting the trials in flight" in text and "interrupted twice (Ctrl-C)" in text and "--resume" in text
    assert took < 30, f"aborting took {took:.0f}s"
    assert wait_until_gone(marker, timeout_s=5) == {}  # servers, rank workers, Ray: all gone

    trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", "ctrlc2")
    by_number = {t.number: t for t in trials}
    aborted = [n for n in in_flight if by_number[n].attrs.get("failure_kind") == "interrupted"]
    assert aborted, {n: (by_number[n].state, by_number[n].attrs) for n in in_flight}
    runs = mlflow_runs(wd, "ctrlc2")
    for n in aborted:
        assert by_number[n].state == "FAIL"
        assert [r.info.status for r in runs[n]] == ["KILLED"]
        assert json.loads((wd / "trials" / f"{n:04d}" / "outcome.json").read_text())["failure_kind"] == "interrupted"
        assert [t.state for t in trials if t.attrs.get("remeasure_of") == n] == ["WAITING"]

    trials = _resume_finishes_the_budget(exp, wd, "ctrlc2", 4, marker)
    for n in aborted:
        again = [t for t in trials if t.attrs.get("remeasure_of") == n]
        assert len(again) == 1 and again[0].state == "COMPLETE" and again[0].params == by_number[n].params
