"""The sweep's loop in-process, real Optuna and MLflow sqlite stores: the real driver on the
model-backed executor (the simulator's model on a virtual clock, orchestrator/testing/), each test a
whole small sweep; the first also runs on the inline executor with real simulator servers, as the
integration check that both executors drive the loop alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from e2e_helpers import demo_experiment, write_experiment
from loop_helpers import run_sweep
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.execute.inline import InlineExecutor
from orchestrator.search.study import read_only
from orchestrator.sweep import state as st
from orchestrator.sweep.driver import Sweep
from orchestrator.sweep.status import status_report
from orchestrator.testing import ModelExecutor


def tiny_space(tmp_path: Path) -> Path:
    space = tmp_path / "tiny.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "params": {
                    "NCCL_PROTO": {"choices": [None, "LL", "LL128", "Simple"]},
                    "NCCL_ALGO": {"choices": [None, "Tree"]},
                },
            }
        )
    )
    return space


@pytest.mark.parametrize("where", ["model", "inline"])
def test_keeps_two_trials_in_flight_and_writes_what_status_reads(tmp_path, sqlite_store_template, where):
    data = demo_experiment(name="inline", budget={"trials": 5, "concurrent_trials": 2}, promotion={"max_rounds": 0})
    inner = InlineExecutor(2) if where == "inline" else None  # real simulator servers, as an integration check
    wd, summary, executor, events = run_sweep(tmp_path, sqlite_store_template, data, inner=inner)

    assert executor.most_at_once == 2
    assert summary.launched == 5 and summary.complete == 5 and summary.failed == 0
    assert summary.stop_kind is st.StopKind.trial_budget and not summary.stopped_by_failure
    launched = [e.number for e in events if isinstance(e, st.TrialLaunched)]
    finished = [e.outcome.number for e in events if isinstance(e, st.TrialFinished)]
    assert sorted(launched) == sorted(finished) == sorted(executor.submitted)
    # One writer per file: the runner's spec.json (with its node and GPUs) and outcome.json are kept.
    for n in launched:
        spec_json = json.loads((wd / "trials" / f"{n:04d}" / "spec.json").read_text())
        assert spec_json["number"] == n and "node" in spec_json
        assert json.loads((wd / "trials" / f"{n:04d}" / "outcome.json").read_text())["status"] == "COMPLETE"
    state = json.loads((wd / "sweep.json").read_text())
    assert state["status"] == "finished" and state["launched"] == 5 and state["stop_kind"] == "trial_budget"
    assert json.loads((wd / "summary.json").read_text())["stop_reason"] == "trial budget reached (5)"
    report = status_report(wd)
    assert (report.launched, report.complete, report.running, report.status) == (5, 5, 0, "finished")
    # Each trial's measured start-up and benchmark seconds are kept with it, for status's estimate.
    for n in launched:
        timings = json.loads((wd / "trials" / f"{n:04d}" / "outcome.json").read_text())["timings"]
        views = read_only(f"sqlite:///{wd / 'optuna.db'}", "inline")
        assert views is not None
        attrs = next(t.attrs for t in views[0] if t.number == n)
        assert attrs["server_start_s"] == round(timings["server_start"], 3) > 0
        assert attrs["bench_s"] == round(timings["bench"], 3) > 0


def test_a_failure_is_recorded_as_data_and_its_parameters_are_settled_without_a_launch(tmp_path, sqlite_store_template):
    data = demo_experiment(
        name="failing",
        sampler={"kind": "random", "seed": 0},
        simulator={"faults": [{"fault": "crash_after_tokens=1", "when": {"NCCL_PROTO": ["LL128", "Simple"]}}]},
        budget={"trials": 8, "concurrent_trials": 2, "max_failure_rate": 0.9},
        promotion={"max_rounds": 0},
    )
    data["search_space"] = [str(tiny_space(tmp_path))]
    wd, summary, executor, _ = run_sweep(tmp_path, sqlite_store_template, data)

    assert summary.failures == {"server_crash": 4} and summary.failed == 4
    trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", "failing")
    failed = [t for t in trials if t.state == "FAIL" and not t.attrs.get("skipped")]
    assert {t.attrs["failure_kind"] for t in failed} == {"server_crash"}
    for t in failed:
        outcome = json.loads((wd / "trials" / f"{t.number:04d}" / "outcome.json").read_text())
        assert outcome["failure_kind"] == "server_crash" and outcome["log_tail"]
    repeats = [
        t for t in trials if t.attrs.get("skipped") and str(t.attrs.get("failure_kind", "")).startswith("duplicate_of")
    ]
    assert repeats, "the sampler never proposed a measured point again (unlikely in 8 points)"
    assert not set(t.number for t in repeats) & set(executor.submitted)  # settled, never launched
    assert len(executor.submitted) == len(set(executor.submitted)) == 8


def test_a_failed_baseline_stops_the_sweep_with_its_kind(tmp_path, sqlite_store_template):
    data = demo_experiment(
        name="nobase",
        budget={"trials": 4, "concurrent_trials": 1},
        simulator={"faults": [{"fault": "never_ready"}]},
        server={"startup_timeout_s": 2},
        promotion={"max_rounds": 0},
    )
    wd, summary, executor, _ = run_sweep(tmp_path, sqlite_store_template, data, slots=1)
    # On the sweep's clock: the baseline's start-up deadline, not a trial budget's worth of waiting.
    assert executor.clock.monotonic() <= 2 + 5
    assert summary.stop_kind is st.StopKind.baseline_failed and summary.stopped_by_failure
    assert "baseline failed" in summary.stop_reason and summary.verdict is None  # no promotion attempted
    assert executor.submitted == [0]


def test_confirmation_runs_go_through_the_executor(tmp_path, sqlite_store_template):
    data = demo_experiment(
        name="confirm",
        budget={"trials": 3, "concurrent_trials": 2},
        promotion={"min_rounds": 3, "max_rounds": 3, "min_gain": 0.0},
    )
    wd, summary, executor, events = run_sweep(tmp_path, sqlite_store_template, data)
    # A speculating champion also has its adaptive-or-fixed counterpart measured beside the main pair.
    runs = [e for e in events if isinstance(e, st.ConfirmationRun) and e.who in ("champion", "baseline")]
    # Interleaved A B, B A, A B: drift during the night hits both alike.
    assert [(e.who, e.round) for e in runs] == [
        ("champion", 1),
        ("baseline", 1),
        ("baseline", 2),
        ("champion", 2),
        ("champion", 3),
        ("baseline", 3),
    ]
    assert executor.submitted.count(-1) == 3  # the baseline's confirmation runs, on the executor
    assert summary.confirmations and {r["status"] for r in summary.confirmations} == {"COMPLETE"}
    assert (wd / "confirm" / "00-champion" / "outcome.json").exists()


def test_the_console_shows_each_skipped_proposal_in_one_line(tmp_path, sqlite_store_template, capsys):
    """`sweep run` prints what it settles without a launch as it happens: an infeasible point with the rule
    it breaks, a repeat with the trial it repeats; the baseline is always launched."""
    from orchestrator.cli.running import _progress_printer

    space = tmp_path / "skips.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "name": "skips",
                "params": {
                    "NCCL_PROTO": {"choices": [None, "LL"]},
                    "speculative_algorithm": {"choices": [None, "EAGLE3"]},
                    "speculative_num_steps": {"choices": [1], "when": {"speculative_algorithm": "EAGLE3"}},
                    "speculative_eagle_topk": {"choices": [2], "when": {"speculative_algorithm": "EAGLE3"}},
                    # 12 - 1 > 2 + 0 * 2^2: infeasible
                    "speculative_num_draft_tokens": {"choices": [2, 12], "when": {"speculative_algorithm": "EAGLE3"}},
                },
            }
        )
    )
    data = demo_experiment(
        name="skips",
        search_space=[str(space)],
        sampler={"kind": "random", "seed": 0},
        budget={"trials": 4, "concurrent_trials": 2},
        promotion={"max_rounds": 0},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    Sweep(spec, wd, executor=ModelExecutor(2), on_event=_progress_printer()).run()

    printed = [line.split(" skipped: ") for line in capsys.readouterr().out.splitlines() if " skipped: " in line]
    shown = {int(head.removeprefix("· trial ")): why for head, why in printed}
    assert len(shown) == len(printed)  # one line each
    trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", "skips")
    skipped = {t.number: t for t in trials if t.attrs.get("skipped")}
    assert set(shown) == set(skipped) and 0 not in shown
    rule = "infeasible (draft tokens - 1 <= topk + (steps - 1) * topk^2)"
    assert (
        {n for n, why in shown.items() if why == rule}
        == {n for n, t in skipped.items() if t.attrs.get("failure_kind") == "infeasible"}
        != set()
    )
    repeats = {n: why for n, why in shown.items() if why != rule}
    assert repeats, "the sampler never proposed a measured point again (unlikely: 4 of 6 points measured)"
    for n, why in repeats.items():
        assert why in (
            f"same parameters as trial {skipped[n].attrs.get('duplicate_of')}",
            skipped[n].attrs.get("reason"),
        )
