"""Without promotion.explain the confirmation measures one arm beside the gate's pair: the rival likeliest to
beat the search's pick (verdict.pick.rival: its pooled estimate credited RIVAL_Z standard errors, when that
reaches the pick's), in place of the adaptive-or-fixed step control, so the night launches no more servers
than its plan said (verdict.schedule.candidate_arms). On a short night the pick and the optimum are often a
near-tie measured once each; the rounds settle it (bench/short_night.py, docs/benchmarks.md). In-process on
the model-backed executor: real Optuna, MLflow sqlite and registry."""

from __future__ import annotations

from e2e_helpers import write_experiment
from loop_helpers import near_tie, run_sweep
from mlflow_fixtures import sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.records import Metrics, TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import select, truth
from orchestrator.search import space as sp
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
    # The seeded pick (4 draft steps) and its rival (2 steps, truly about 14% faster) were measured once
    # each in the search at 6% noise; in the same rounds the rival wins and is deployed.
    assert summary.promoted and summary.promoted_config == "runner_up", summary.verdict
    assert distance(champion["params"], deployed["params"]) >= 1
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


def test_the_rival_is_the_point_likeliest_to_beat_the_pick():
    """The pick (trial 1: EAGLE-3, 3 steps, NCCL_PROTO=LL) and its neighbours under LL and NCCL defaults.
    By the search's pooled estimate the best other point is trial 3 (the pick's shape at NCCL defaults,
    -0.7%); the rival is the point whose estimate, credited RIVAL_Z standard errors, reaches highest:
    trial 4 (4 steps at NCCL defaults, -1.8% but measured once, with the widest interval). The near-tie
    worth measuring again is the one the search knows least. Nothing is a rival when even that bound
    falls short of the pick."""
    a = {"NCCL_PROTO": "LL", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3}
    near = {**a, "speculative_num_steps": 4}
    tree = {**a, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6}
    outcomes = [
        _searched(1, 100.0, a),
        _searched(2, 99.0, near),
        _searched(3, 97.0, {**a, "NCCL_PROTO": None}),
        _searched(4, 96.0, {**near, "NCCL_PROTO": None}),
        _searched(6, 96.0, a),
        _searched(7, 95.0, near),
        _searched(5, 95.0, {**tree, "NCCL_PROTO": None}),
    ]
    champion = select.pick_champion(outcomes, metric="decode_tok_s", direction="maximize", concurrency=1)
    assert champion is not None and champion.number == 1
    eligible = select.eligible_values(outcomes, metric="decode_tok_s", constraints={})
    contrasts = {
        o.number: c
        for o, _ in eligible
        if distance(o.params, champion.params) >= 1
        and (c := pick.search_contrast(eligible, champion.params, o.params, direction="maximize")) is not None
    }
    assert max(contrasts, key=lambda n: contrasts[n].diff) == 3
    found = pick.rival(eligible, champion, direction="maximize")
    assert found is not None
    other, search = found
    assert other.number == 4 and search == contrasts[4]
    assert search.diff < 0.0 < search.diff + select.RIVAL_Z * search.se
    # Clearly slower everywhere: no rival.
    slow = [_searched(1, 100.0, a), _searched(2, 80.0, near), _searched(3, 100.5, a), _searched(4, 79.0, near)]
    slow_eligible = select.eligible_values(slow, metric="decode_tok_s", constraints={})
    assert pick.rival(slow_eligible, slow[0], direction="maximize") is None
