"""Without promotion.explain the confirmation measures one arm beside the gate's pair: the search pick's
nearest rival while the search's own measurements leave it a chance to be the better (verdict.pick.rival),
in place of the adaptive-or-fixed step control, so the night launches no more servers than its plan said
(verdict.schedule.candidate_arms). On a short night the pick and its rival are often a near-tie measured
once each; the rounds settle it (bench/short_night.py: 15/20 nights at 98% of the optimum before, docs/
benchmarks.md). In-process on the model-backed executor: real Optuna, MLflow sqlite and registry."""

from __future__ import annotations

from e2e_helpers import write_experiment
from loop_helpers import near_tie, run_sweep
from mlflow_fixtures import sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.records import Metrics, TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import truth
from orchestrator.search import space as sp
from orchestrator.stats import Contrast
from orchestrator.verdict import pick, schedule
from orchestrator.verdict.arms import STEPS_ARMS
from orchestrator.verdict.pick import distance


def test_a_near_tie_without_explain_is_settled_by_the_rival_in_the_step_control_s_seat(tmp_path, sqlite_store_template):
    data = near_tie(tmp_path, max_rounds=6)
    data["promotion"]["explain"] = False
    spec = spec_mod.load(write_experiment(tmp_path, data, name="again.yaml"))
    # The plan before the night: the gate's pair and the step control's seat (which the rival takes).
    planned = schedule.candidate_arms(spec)
    assert [name for name, _, _ in planned] == ["champion", "baseline", "runner_up or steps@1"]
    said = schedule.night_plan(spec).lines()
    assert "confirmation: runner_up or steps@1 at 1 stream(s), 3 round(s)" in "\n".join(said), said
    wd, summary, _, _ = run_sweep(tmp_path, sqlite_store_template, data)
    measured: dict[str, dict[int, dict]] = {}
    for row in summary.confirmations or []:
        measured.setdefault(row["who"], {})[row["round"]] = row
    assert set(measured) == {"champion", "baseline", "runner_up"}, sorted(measured)
    assert not set(measured) & set(STEPS_ARMS)
    # Each round measured no more arms than the plan held seats for.
    assert len(measured["runner_up"]) <= len(measured["champion"])
    assert len(measured["runner_up"]) >= spec.promotion.min_rounds
    champion = summary.champion or {}
    deployed = summary.deployed or {}
    value = truth.evaluator(spec)  # the simulator's noise-free model
    searched = value(sp.complete(spec.space, champion["params"]))
    shipped = value(sp.complete(spec.space, deployed["params"]))
    # The seeded pick (4 draft steps) and its rival one knob away (2 steps, truly about 14% faster) were
    # measured once each in the search at 6% noise; in the same rounds the rival wins and is deployed.
    assert summary.promoted and summary.promoted_config == "runner_up", summary.verdict
    assert distance(champion["params"], deployed["params"]) == 1
    assert shipped > searched


def _searched(number: int, value: float, params: dict) -> TrialOutcome:
    return TrialOutcome(
        number=number,
        params=params,
        role=TrialRole.search,
        status=TrialStatus.COMPLETE,
        metrics=Metrics(decode_tok_s=value, output_tok_s=value),
        effective_env={"ok": True},
    )


def test_the_rival_is_the_nearest_point_the_search_cannot_rule_out():
    a = {"NCCL_PROTO": "LL", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3}
    near = {**a, "speculative_num_steps": 4}  # one knob away: not a runner-up "from another region"
    outcomes = [
        _searched(1, 100.0, a),
        _searched(2, 99.0, near),
        _searched(3, 80.0, {**a, "NCCL_PROTO": None, "speculative_algorithm": None}),
        _searched(4, 81.0, {**near, "NCCL_PROTO": None}),
    ]
    champion = outcomes[0]
    args = dict(metric="decode_tok_s", direction="maximize", concurrency=1, constraints={})
    other_region = pick.runner_up(outcomes, champion, **args)
    assert other_region is not None and other_region.number != 2
    nearest = pick.runner_up(outcomes, champion, distance_min=1, **args)
    assert nearest is not None and nearest.number == 2
    # The rule on the search's contrast (positive: the rival is the better): RIVAL_Z standard errors up.
    assert pick.rival(Contrast(-0.01, 0.01))
    assert not pick.rival(Contrast(-0.10, 0.01))
    assert not pick.rival(None)
