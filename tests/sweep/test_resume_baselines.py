"""--resume rebuilds the sweep's baselines as the live sweep kept them (issues 21 and 23): every
baseline measurement, the search's baseline trials and the confirmation rounds' baselines, at the
time it was measured (the outcome's `finished_at`, on the sweep's clock; not when Optuna was told,
which on the model-backed executor's virtual clock is another time base altogether). So the trials
measured after the resume are compared with the baseline the live sweep would have picked.

The real driver on the model-backed executor (orchestrator/testing), one virtual clock that goes on
across the resume as a night's does; real Optuna and MLflow sqlite stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.clock import VirtualClock
from orchestrator.config import experiment as spec_mod
from orchestrator.results import select
from orchestrator.search.study import read_only
from orchestrator.sweep import state as st
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def _sweep_json(wd: Path) -> st.SweepState:
    return st.SweepState.model_validate_json((wd / "sweep.json").read_bytes())


def _finished_at(wd: Path, number: int) -> float:
    return float(json.loads((wd / "trials" / f"{number:04d}" / "outcome.json").read_text())["finished_at"])


@pytest.mark.parametrize("confirm", [False, True], ids=["search-only", "after-a-confirmation"])
def test_a_resume_keeps_every_baseline_at_its_measured_time(tmp_path, sqlite_store_template, confirm):
    promotion = {"min_rounds": 3, "max_rounds": 3} if confirm else {"max_rounds": 0}
    data = demo_experiment(
        name="bases", budget={"trials": 6, "concurrent_trials": 1, "baseline_every": 3}, promotion=promotion
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    clock = VirtualClock()  # the night's: it goes on across the resume
    Sweep(spec, wd, executor=ModelExecutor(1, clock=clock)).run()  # stops on its trial budget
    live = _sweep_json(wd).baselines
    trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", spec.name) or ([], {})
    searched = sorted(
        (_finished_at(wd, t.number), float(t.values[0]))
        for t in trials
        if t.role == "baseline" and t.state == "COMPLETE" and t.values
    )
    assert len(searched) >= 2  # the first baseline and at least one re-measurement (baseline_every)
    rounds = [b for b in live if b not in searched]
    if confirm:  # the confirmation's rounds measured the baseline too: the live sweep kept those
        assert len(rounds) == 3 and min(at for at, _ in rounds) > max(at for at, _ in searched)
    else:
        assert rounds == []
    assert live == sorted(live), "kept in the order measured"

    seen: list[list[tuple[float, float]]] = []
    resumed: list[Sweep] = []

    def at_ready(event: object) -> None:  # after the resume's recovery, before its first launch
        if isinstance(event, st.ExecutorReady):
            seen.append(list(resumed[0].progress.baselines))

    resumed.append(Sweep(spec, wd, executor=ModelExecutor(1, clock=clock), resume=True, n_trials=8, on_event=at_ready))
    resumed[0].run()

    # What the resume rebuilt: the live list, values and times alike, the confirmation's included.
    assert seen == [live]

    # Each trial of the resumed run is compared with the baseline the live sweep would have picked:
    # the nearest in time among the live ones and those measured since.
    after, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", spec.name) or ([], {})
    before = {t.number for t in trials}
    new = sorted(
        (t for t in after if t.number not in before and t.state == "COMPLETE" and t.values),
        key=lambda t: _finished_at(wd, t.number),
    )
    assert any(t.role == "search" for t in new), "the resumed run measured trials"
    known = list(live)
    picked: list[float] = []
    for t in new:
        at = _finished_at(wd, t.number)
        if t.role == "baseline":
            known.append((at, float(t.values[0])))
        base = select.nearest_baseline(at, known)
        assert base is not None
        want = select.speedup(float(t.values[0]), base, direction=spec.objective.direction)
        assert t.attrs["speedup_vs_baseline"] == pytest.approx(want), t.number
        picked.append(base)
    assert set(picked) != {searched[0][1]}, "a later baseline is the nearest for some trial: the test tells them apart"
    if confirm:  # the trials just after the resume are nearest the confirmation's last baseline
        assert picked[0] == rounds[-1][1]
    # sweep.json keeps them all, in the order measured, for `sweep status` and the report.
    final = _sweep_json(wd).baselines
    assert set(live) <= set(final) and final == sorted(final)


def test_a_baseline_whose_outcome_json_is_lost_keeps_its_measured_time(tmp_path, sqlite_store_template):
    """The study keeps each trial's finished_at: with the baseline's outcome.json gone, the resume still
    places it where it was measured (not at Optuna's completion time, on the machine's clock)."""
    data = demo_experiment(name="lost", budget={"trials": 3, "concurrent_trials": 1}, promotion={"max_rounds": 0})
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    clock = VirtualClock()
    Sweep(spec, wd, executor=ModelExecutor(1, clock=clock)).run()
    live = _sweep_json(wd).baselines
    assert len(live) == 1 and live[0][0] == _finished_at(wd, 0)
    (wd / "trials" / "0000" / "outcome.json").unlink()

    seen: list[list[tuple[float, float]]] = []
    resumed: list[Sweep] = []

    def at_ready(event: object) -> None:
        if isinstance(event, st.ExecutorReady):
            seen.append(list(resumed[0].progress.baselines))

    resumed.append(Sweep(spec, wd, executor=ModelExecutor(1, clock=clock), resume=True, n_trials=4, on_event=at_ready))
    resumed[0].run()
    assert seen == [live]
