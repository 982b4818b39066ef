"""Near-ties settled by measurement during the search (issue 20): with sampler.remeasure_every, every
K-th complete search trial after the start-up trials queues the best point or its closest rival again
(results.select.near_tie), and the loop launches that repeat instead of settling it as a duplicate.
The real driver, Optuna study and MLflow store, on the model-backed executor (virtual clock)."""

from __future__ import annotations

from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.records import TrialOutcome, TrialRole, TrialStatus
from orchestrator.search import space as sp
from orchestrator.search.proposal import REMEASURE_ATTR
from orchestrator.search.study import read_only
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def _night(tmp_path, template, name: str, every: int) -> tuple[list[TrialOutcome], list, str]:
    data = demo_experiment(
        name=name,
        simulator={"noise": 0.04},
        sampler={"kind": "tpe", "seed": 3, "startup_trials": 4, "remeasure_every": every},
        budget={"trials": 16, "concurrent_trials": 1, "trial_timeout_s": 60},
    )
    (tmp_path / name).mkdir()
    spec = spec_mod.load(write_experiment(tmp_path / name, data))
    wd = tmp_path / name / "wd"
    copy_store(template, wd)
    Sweep(spec, wd, executor=ModelExecutor(1)).run()
    outcomes = [TrialOutcome.model_validate_json(p.read_text()) for p in sorted((wd / "trials").glob("*/outcome.json"))]
    views = read_only(f"sqlite:///{wd / 'optuna.db'}", spec.name)
    assert views is not None
    return outcomes, views[0], (wd / "sweep.log").read_text()


def test_near_ties_are_measured_again_and_the_repeats_are_launched(tmp_path, sqlite_store_template):
    outcomes, trials, log = _night(tmp_path, sqlite_store_template, "again", 2)
    searched = [o for o in outcomes if o.role is TrialRole.search and o.status is TrialStatus.COMPLETE]
    queued = {t.number: t.attrs[REMEASURE_ATTR] for t in trials if REMEASURE_ATTR in t.attrs}
    assert queued, "no near-tie was queued in a 4%-noise night of 16 trials"
    by_number = {o.number: o for o in outcomes}
    for number, of in queued.items():
        # Launched and measured (a server run of its own, not a duplicate told the earlier result) ...
        again = by_number[number]
        assert again.role is TrialRole.search and again.status is TrialStatus.COMPLETE and again.metrics is not None
        # ... at exactly the earlier trial's point, after the start-up trials.
        assert sp.key(again.params) == sp.key(by_number[of].params) and of < number
        assert sum(1 for o in searched if o.number < number) >= 4
        assert f"measures trial {of}'s parameters again" in log
    # None of them was settled as a repeat without a launch (the proposal policy's duplicate rule).
    assert not [t for t in trials if t.number in queued and (t.attrs.get("skipped") or "duplicate_of" in t.attrs)]


def test_without_remeasure_every_each_trial_is_a_new_point(tmp_path, sqlite_store_template):
    outcomes, trials, log = _night(tmp_path, sqlite_store_template, "never", 0)
    searched = [o for o in outcomes if o.role is TrialRole.search and o.status is TrialStatus.COMPLETE]
    assert len({sp.key(o.params) for o in searched}) == len(searched)
    assert not any(REMEASURE_ATTR in t.attrs for t in trials) and "parameters again" not in log
