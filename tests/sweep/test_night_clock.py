"""One clock for the night (issue 20): `--timeout` covers the probe, the search and the confirmation.
The real driver on the model-backed executor at real scale (simulator.time_scale 1: ten-minute trials
on a virtual clock), so the night's arithmetic is the tool's own, in seconds of test time."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.sweep import schedule
from orchestrator.sweep import state as st
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def real_scale(**overrides: object) -> dict:
    """The demo experiment as a GPU host would run it: real load times, 16 x 512 tokens per repeat."""
    return demo_experiment(
        **{
            "simulator": {"time_scale": 1.0},
            "server": {"startup_timeout_s": 1800},
            "benchmark": {
                "requests": 16,
                "input_len": 512,
                "output_len": 512,
                "warmup_requests": 2,
                "stall_timeout_s": 300,
            },
            "budget": {"trials": 1000, "concurrent_trials": 1, "trial_timeout_s": 3600},
            "promotion": {"min_rounds": 3, "max_rounds": 12, "explain": True, "concurrency": [1, 8, 32]},
            **overrides,
        }
    )


def test_a_confirmation_that_would_not_fit_drops_arms_and_the_night_ends_on_time(tmp_path, sqlite_store_template):
    data = real_scale(
        name="tight", budget={"trials": 1000, "concurrent_trials": 1, "trial_timeout_s": 3600, "wall_time": "3h"}
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    night = schedule.night_plan(spec)
    assert night.fits and night.confirmation.dropped  # the plan already leaves arms out of a 3-hour night
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    executor = ModelExecutor(1)
    events: list = []
    summary = Sweep(spec, wd, executor=executor, on_event=events.append).run()

    # The deadline is kept: the whole run, confirmation included, inside --timeout plus one trial's deadline.
    assert executor.clock.monotonic() <= spec.budget.wall_time + spec.budget.trial_timeout_s
    assert summary.stop_kind is st.StopKind.wall_time and "held back for the confirmation" in summary.stop_reason
    # The arms that did not fit are named, with why, on the console (events) and in summary.json.
    dropped = [e for e in events if isinstance(e, st.ArmDropped)]
    assert dropped and {e.name for e in dropped} >= {"champion@32", "baseline@32"}
    saved = json.loads((wd / "summary.json").read_text())
    assert saved["not_measured"] and all(": " in line for line in saved["not_measured"])
    measured_arms = {row["who"] for row in saved["confirmations"]}
    assert {"champion", "baseline"} <= measured_arms and not measured_arms & {e.name for e in dropped}
    assert summary.outcome is not None  # a verdict, reached inside the night
    # The search stopped early enough: no search trial ends after the reserve began.
    reserve = schedule.reserve(spec, [], slots=1).seconds
    last_search = max(json.loads(p.read_text())["finished_at"] for p in (wd / "trials").glob("*/outcome.json"))
    epoch = executor.clock.time() - executor.clock.monotonic()
    assert last_search - epoch <= spec.budget.wall_time - reserve + spec.budget.trial_timeout_s


def test_sweep_plan_prints_the_night_and_refuses_one_whose_minimum_cannot_fit(tmp_path):
    fits = write_experiment(tmp_path, real_scale(name="fits", budget={"wall_time": "8h"}), name="fits.yaml")
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "plan", str(fits), "--limit", "0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    night = next(line for line in proc.stdout.splitlines() if line.startswith("night: "))
    assert "probe" in night and "search" in night and "confirmation" in night
    assert "confirmation: champion at 1 stream(s), 3 round(s)" in proc.stdout
    too_short = write_experiment(tmp_path, real_scale(name="short", budget={"wall_time": "30m"}), name="short.yaml")
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "plan", str(too_short), "--limit", "0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "does not fit budget.wall_time" in proc.stdout + proc.stderr
    assert "lower promotion.min_rounds" in proc.stdout + proc.stderr


def test_sweep_status_shows_the_schedule_live(tmp_path, sqlite_store_template):
    """While the search runs, sweep.json holds the plan of the rest of the night and `sweep status`'s
    report carries it: when the search ends and each confirmation arm held back."""
    from orchestrator.sweep.status import status_report

    data = real_scale(
        name="live", budget={"trials": 4, "concurrent_trials": 1, "trial_timeout_s": 3600, "wall_time": "8h"}
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    seen: list[list[str]] = []

    def on_event(event: object) -> None:
        if isinstance(event, st.TrialFinished):
            seen.append(status_report(wd).schedule)

    Sweep(spec, wd, executor=ModelExecutor(1), on_event=on_event).run()
    assert seen and all(lines for lines in seen)
    head = seen[-1][0]
    assert head.startswith("search until about ") and "of 8.00 h" in head and "held back" in head
    assert any(line.startswith("confirmation: champion at 1 stream(s)") for line in seen[-1])


def test_an_undecided_gate_takes_the_time_held_for_the_arms_measured_after_it(tmp_path, sqlite_store_template):
    """At 12% noise three rounds do not decide. The time held for the deployed configuration's other load
    (promotion.concurrency 8) describes nothing while nothing is decided, so the gate's rounds 4-6 take it
    and it promotes; the other load's arms are then dropped with a line, and the deadline holds. Before
    this change the same night (this experiment, seed 0) ended `undecided after 3 complete round(s)`."""
    data = real_scale(
        name="held",
        simulator={"time_scale": 1.0, "noise": 0.12},
        budget={"trials": 1000, "concurrent_trials": 1, "trial_timeout_s": 3600, "wall_time": "6h"},
        promotion={"min_rounds": 3, "max_rounds": 12, "explain": False, "concurrency": [1, 8]},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    executor = ModelExecutor(1)
    summary = Sweep(spec, wd, executor=executor).run()
    log = (wd / "sweep.log").read_text()
    assert "the gate is still undecided after 3 rounds; round 4 takes the time held" in log
    assert summary.outcome is st.Outcome.promoted and summary.confirmed is not None, summary.verdict
    assert summary.confirmed.rounds > spec.promotion.min_rounds
    # Round 3 already kept time for the gate's later rounds (15% noise: rounds_needed says 11 on the
    # degrees of freedom the other arms add, sequential.gate_df; 12 on the pair's own), leaving out the
    # adaptive-or-fixed counterpart (named after what the champion is not); the other load's arms get
    # what the gate left and are dropped with a line.
    need = re.search(r"so the gate is expected to need (\d+) rounds", log)
    assert need is not None and need.group(1) == "11", log  # 12 on the pair's own degrees of freedom
    assert re.search(r"round 3 leaves out (adaptive|fixed) \(", log)
    assert re.search(r"no time left for round \d of champion@8, baseline@8", log)  # the later arms
    assert executor.clock.monotonic() <= spec.budget.wall_time + spec.budget.trial_timeout_s
