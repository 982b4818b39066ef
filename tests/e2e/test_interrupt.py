"""A sweep that stops early. Ctrl-C, as a terminal sends it (SIGINT to the whole foreground process
group, Ray's own processes included): the first press lets the trials in flight finish and launches
nothing more, the second aborts them now; both exit non-zero with a message, leave no process behind
and a study that `--resume` finishes. And the sweep stops itself, exit code 1 with a summary, when
trials keep failing or the baseline fails."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid

import pytest
from e2e_helpers import (
    measured,
    mlflow_runs,
    nccl_space,
    new_workdir,
    resume,
    run_to_the_end,
    served_experiment,
    short_sweep,
    start_sweep,
    sweep,
    trial_files,
    wait_for,
    wait_until_gone,
    write_experiment,
)
from mlflow_fixtures import sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.search.study import read_only

pytestmark = pytest.mark.slow


def _resume_finishes_the_budget(exp, wd, name: str, budget: int, marker: str) -> list:
    resume(exp, wd, marker)
    trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", name)
    assert len(measured(trials)) == budget
    assert not [t for t in trials if t.state in ("RUNNING", "WAITING")]
    assert json.loads((wd / "summary.json").read_text())["champion"]
    assert wait_until_gone(marker, timeout_s=120) == {}
    return trials


PRESSED_ONCE = "stopping after the trials in flight (Ctrl-C again to abort them)"


def _launched(text: str) -> set[int]:
    """The trial numbers the sweep printed as launched (`▶ trial N`) in `text`."""
    return {int(n) for n in re.findall(r"▶ trial +(\d+)", text)}


def test_ctrl_c_once_finishes_the_trials_in_flight_then_resume_finishes_the_budget(tmp_path, sqlite_store_template):
    exp, wd, marker, log = (
        short_sweep(tmp_path, "ctrlc", 5),
        new_workdir(tmp_path, sqlite_store_template),
        uuid.uuid4().hex,
        tmp_path / "run.log",
    )
    proc = start_sweep(exp, wd, marker, log)
    try:
        in_flight = wait_for(
            lambda: (lambda f, r: len(f) >= 1 and len(r) == 2 and r)(*trial_files(wd)), proc, log, timeout_s=900
        )
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=1200)  # a hang guard: the trials in flight finish first
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 1, text
    assert "Traceback" not in text
    assert PRESSED_ONCE in text
    assert "interrupted (Ctrl-C): no new trials launched, the trials in flight finished" in text
    assert "--resume" in text
    # The sweep prints the press where its loop saw it: every launch is printed before it, none after.
    before, after = text.split(PRESSED_ONCE, 1)
    assert not _launched(after), after
    finished, running = trial_files(wd)
    assert not running and set(finished) == _launched(before)  # nothing launched after the press
    for n in in_flight:  # the trials in flight ran to their end
        assert finished[n]["status"] == "COMPLETE", finished[n]["reason"]
    trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", "ctrlc")
    assert not [t for t in trials if t.state == "RUNNING" or t.attrs.get("failure_kind") == "interrupted"]
    assert wait_until_gone(marker, timeout_s=120) == {}

    _resume_finishes_the_budget(exp, wd, "ctrlc", 5, marker)


HUNG = [
    {"fault": "nccl_hang", "when": {"NCCL_PROTO": ["LL", "LL128", "Simple"]}},
    {"fault": "nccl_hang", "when": {"NCCL_ALGO": ["Ring", "Tree"]}},
]
"""Every point but the baseline's (nothing set) hangs in its first all-reduce: no token, ever."""

NEVER_S = 7200
"""The stall and trial timeouts of the hung run: far longer than the test, so only the abort ends a hung trial."""


def test_ctrl_c_twice_aborts_the_trials_in_flight_now_and_they_are_measured_again(tmp_path, sqlite_store_template):
    name, wd, marker, log = (
        "ctrlc2",
        new_workdir(tmp_path, sqlite_store_template),
        uuid.uuid4().hex,
        tmp_path / "run.log",
    )
    search_space = [str(nccl_space(tmp_path, ["Ring", "Tree"]))]
    # trial_timeout_s 1800: the healthy --resume must not time its trials out on a loaded machine (the demo's 60 s
    # was passed at load 20).
    common = dict(
        name=name,
        search_space=search_space,
        budget={"trials": 4, "concurrent_trials": 2, "trial_timeout_s": 1800},
        benchmark={"repeats": 2},
        promotion={"max_rounds": 0, "min_gain": 0.0},
    )
    # The first run: the search trials hang, and nothing but the abort can end them.
    hung = write_experiment(
        tmp_path,
        served_experiment(
            **{
                **common,
                "simulator": {"faults": HUNG},
                "budget": {**common["budget"], "trial_timeout_s": NEVER_S},
                "benchmark": {"repeats": 2, "stall_timeout_s": NEVER_S, "timeout_s": NEVER_S},
            }
        ),
        "hung.yaml",
    )
    exp = write_experiment(tmp_path, served_experiment(**common))  # the same sweep, healthy, for --resume
    proc = start_sweep(hung, wd, marker, log)

    def two_servers_up():
        finished, running = trial_files(wd)
        up = {n for n in running if (wd / "trials" / f"{n:04d}" / "server.pid").exists()}
        return len(finished) >= 1 and len(up) == 2 and up

    try:
        in_flight = wait_for(two_servers_up, proc, log, timeout_s=900)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=1200)  # a hang guard, far below NEVER_S: only an abort can end the sweep in time
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 1, text
    assert "Traceback" not in text
    assert "aborting the trials in flight" in text and "interrupted twice (Ctrl-C)" in text and "--resume" in text
    assert wait_until_gone(marker, timeout_s=120) == {}  # servers, rank workers, Ray: all gone

    trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", name)
    by_number = {t.number: t for t in trials}
    # Every trial in flight hung (none is the baseline): each ended by the abort, none on its own.
    assert all(by_number[n].role == "search" for n in in_flight)
    assert {n: by_number[n].attrs.get("failure_kind") for n in in_flight} == {n: "interrupted" for n in in_flight}
    runs = mlflow_runs(wd, name)
    for n in in_flight:
        assert by_number[n].state == "FAIL"
        assert [r.info.status for r in runs[n]] == ["KILLED"]
        assert json.loads((wd / "trials" / f"{n:04d}" / "outcome.json").read_text())["failure_kind"] == "interrupted"
        assert [t.state for t in trials if t.attrs.get("remeasure_of") == n] == ["WAITING"]
        bench = wd / "trials" / f"{n:04d}" / "bench.jsonl"
        tokens = (
            [json.loads(line)["completion_tokens"] for line in bench.read_text().splitlines()] if bench.exists() else []
        )
        assert sum(tokens) == 0, tokens  # hung from its first request: the abort ended it, not the benchmark

    trials = _resume_finishes_the_budget(exp, wd, name, 4, marker)
    for n in in_flight:
        again = [t for t in trials if t.attrs.get("remeasure_of") == n]
        assert len(again) == 1 and again[0].state == "COMPLETE" and again[0].params == by_number[n].params


# ---------------------------------------------------------------------- the sweep stops itself

ALL_FAIL = [
    {"fault": "crash_after_tokens=1", "when": {"NCCL_PROTO": ["LL", "LL128", "Simple"]}},
    {"fault": "crash_after_tokens=1", "when": {"NCCL_ALGO": ["Ring", "Tree"]}},
]
"""Every point but the baseline's (nothing set) fails."""


def _failing_sweep(tmp_path, template, name: str, budget: dict, faults: list):
    data = served_experiment(
        name=name,
        simulator={"faults": faults},
        promotion={"max_rounds": 0},
        budget={"trials": 10, "concurrent_trials": 2, **budget},
        search_space=[str(nccl_space(tmp_path, ["Ring", "Tree"]))],
    )
    return run_to_the_end(tmp_path, template, data)


@pytest.mark.parametrize(
    "rule, budget, message",
    [
        (
            "consecutive",
            {"max_consecutive_failures": 3, "max_failure_rate": 1.0},
            # the run may be longer than 3: failures that share a knob value are a region the search leaves
            "trials failed in a row (budget.max_consecutive_failures=3), all server_crash with nothing in",
        ),
        (
            "rate",
            {"max_failure_rate": 0.5, "min_trials_for_failure_rate": 3, "max_consecutive_failures": 10},
            "above budget.max_failure_rate=0.5",
        ),
    ],
)
def test_repeated_failures_stop_the_sweep_with_a_summary(tmp_path, sqlite_store_template, rule, budget, message):
    proc, wd, trials = _failing_sweep(tmp_path, sqlite_store_template, f"fails-{rule}", budget, ALL_FAIL)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert message in proc.stdout and "failures by kind: {'server_crash'" in proc.stdout
    assert "the set-up is broken: " in proc.stdout  # every configuration failed alike, whatever its parameters
    launched = [t for t in trials if not t.attrs.get("skipped")]
    assert len(launched) < 10  # stopped early instead of spending the budget on a broken set-up
    failed = [t for t in launched if t.state == "FAIL"]
    assert failed and all(t.attrs["failure_kind"] == "server_crash" for t in failed)
    status = sweep("status", "--workdir", str(wd))
    assert f"server_crash {len(failed)}" in status.stdout and message in status.stdout, status.stdout


def test_a_failed_baseline_stops_the_sweep_at_once(tmp_path, sqlite_store_template):
    proc, wd, trials = _failing_sweep(tmp_path, sqlite_store_template, "badbase", {}, ["crash_after_tokens=1"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    assert "the baseline failed (server_crash" in proc.stdout and "server.log" in proc.stdout
    baseline = trials[0]
    assert baseline.role == "baseline" and baseline.state == "FAIL"
    # Nothing launched after it; what was in flight beside it was aborted, to be measured on --resume.
    others = [t for t in trials[1:] if not t.attrs.get("skipped") and t.state != "WAITING"]
    assert others and all(t.start <= baseline.end for t in others)
    in_flight = [t for t in others if t.end >= baseline.end]
    assert all(t.attrs["failure_kind"] == "interrupted" for t in in_flight)
    waiting = [t for t in trials if t.state == "WAITING"]
    assert sorted(t.attrs["remeasure_of"] for t in waiting) == sorted(t.number for t in in_flight)
    assert json.loads((wd / "summary.json").read_text())["promoted"] is False
