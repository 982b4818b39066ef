"""A run's own speed taken out of the search's measurements (results.select.run_speed): each complete
trial's TTFT reaches the study (search/sampler.RUN_TTFT_ATTR, what the refinement ranks with), and the
log says whether the pick adjusted for it. A real sweep (sweep.Sweep) on the model-backed executor at 4%
noise, in the simulator's world where a run is one speed (simulator.noise_prefill_correlation 1) and in
one where its TTFT says nothing of its decode speed (0)."""

from __future__ import annotations

import json
import re

import optuna
import pytest
from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.search.sampler import RUN_TTFT_ATTR, adjusted
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def run(tmp_path, template, correlation: float, streams: int = 1):  # type: ignore[no-untyped-def]
    data = demo_experiment(
        name=f"speed{int(correlation)}",
        simulator={"noise": 0.04, "noise_prefill_correlation": correlation},
        budget={"trials": 24, "concurrent_trials": 2},
        promotion={"max_rounds": 0},
        sampler={"remeasure_every": 2, "startup_trials": 4},
    )
    data["benchmark"]["input_len"] = 256
    data["objective"]["concurrency"] = streams
    spec = spec_mod.load(write_experiment(tmp_path, data, name=f"speed-{correlation}-{streams}.yaml"))
    wd = tmp_path / f"wd{correlation}-{streams}"
    copy_store(template, wd)
    Sweep(spec, wd, executor=ModelExecutor(2)).run()
    return spec, wd


def test_the_runs_ttft_reaches_the_study_and_the_pick_says_it_adjusted(tmp_path, sqlite_store_template):
    _, wd = run(tmp_path, sqlite_store_template, 1.0)
    outcomes = {
        json.loads(p.read_text())["number"]: json.loads(p.read_text()) for p in (wd / "trials").glob("*/outcome.json")
    }
    log = (wd / "sweep.log").read_text()
    found = re.search(
        r"the pick takes each run's own speed out of decode_tok_s: a run's TTFT moves with it "
        r"\(slope (-?[\d.]+) \+- ([\d.]+), (\d+) degrees of freedom",
        log,
    )
    assert found is not None, log
    # one speed for the run: the slope is -1 but for the repeats' own jitter, drawn apart for decode and prefill
    assert -1.15 < float(found[1]) < -0.85 and float(found[2]) < 0.1 and int(found[3]) >= 3
    storage = f"sqlite:///{wd / 'optuna.db'}"
    (name,) = optuna.get_all_study_names(storage)
    complete = [
        t
        for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        if t.state == optuna.trial.TrialState.COMPLETE
    ]
    assert len(complete) >= 12
    for t in complete:
        assert t.user_attrs[RUN_TTFT_ATTR] == outcomes[t.number]["metrics"]["ttft_ms_p50"]


def test_where_ttft_says_nothing_of_decode_the_pick_uses_the_measurements_as_they_are(tmp_path, sqlite_store_template):
    _, wd = run(tmp_path, sqlite_store_template, 0.0)
    log = (wd / "sweep.log").read_text()
    assert "the pick uses decode_tok_s as measured: the runs' TTFT does not move with it (slope" in log, log


def test_above_one_stream_the_pick_uses_the_measurements_as_they_are(tmp_path, sqlite_store_template):
    # select.run_speed_metric: at 4 streams a new request waits for the running batch's cycle before its
    # prefill (simulator/engine.py's loop; SGLang 0.5.23's srt/managers/scheduler.py Scheduler.event_loop_normal
    # takes in requests and calls get_next_batch_to_run only between forward passes), so its TTFT carries the
    # configuration's cycle time.
    _, wd = run(tmp_path, sqlite_store_template, 1.0, streams=4)
    log = (wd / "sweep.log").read_text()
    assert (
        "the pick uses decode_tok_s as measured: at 4 streams a request's TTFT also waits for the running "
        "batch's decode cycle"
    ) in log, log
    assert "the pick takes each run's own speed out" not in log
    storage = f"sqlite:///{wd / 'optuna.db'}"
    (name,) = optuna.get_all_study_names(storage)
    complete = [
        t
        for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        if t.state == optuna.trial.TrialState.COMPLETE
    ]
    assert len(complete) >= 12 and not any(RUN_TTFT_ATTR in t.user_attrs for t in complete)


def test_the_refinement_ranks_adjusted_values_and_leaves_untimed_runs_as_measured() -> None:
    a = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "NCCL_PROTO": "LL"}
    b = {**a, "speculative_num_steps": 2}
    # A's runs came up 5% slow, B's 5% fast, at prefill as at decode; B is truly 2% slower.
    speed = (1.05, 1.06, 1.04, 1.03, 0.95, 0.94, 0.96, 0.97)
    measured = [(100 / f, a) for f in speed[:4]] + [(98 / f, b) for f in speed[4:]]
    ttft = [40.0 * f for f in speed]
    ranked = adjusted(measured, ttft)
    assert [p for _, p in ranked] == [p for _, p in measured]
    raw = {k: sum(v for v, p in measured if p is pt) / 4 for k, pt in (("a", a), ("b", b))}
    mean = {k: sum(v for v, p in ranked if p is pt) / 4 for k, pt in (("a", a), ("b", b))}
    assert raw["a"] < raw["b"]  # B ahead as measured
    assert mean["a"] / mean["b"] == pytest.approx(100 / 98)  # A ahead by its true 2% once each run's speed is out
    # a run without TTFT (a trial of a study begun before RUN_TTFT_ATTR was kept) stays as measured; the rest
    # are adjusted all the same
    partly = adjusted(measured, [*ttft[:7], None])
    assert partly[-1] == measured[-1]
    assert max(v for v, _ in partly[:7]) > 0  # the seven timed runs: each point's runs at one speed again
    assert partly[0][0] == pytest.approx(partly[3][0]) and partly[4][0] == pytest.approx(partly[6][0])
    assert partly[0][0] / partly[4][0] == pytest.approx(100 / 98)
    assert adjusted(measured, [None] * 8) == measured
