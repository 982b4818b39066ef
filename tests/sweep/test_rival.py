"""Without promotion.explain the confirmation measures one arm beside the gate's pair: the rival the search
can least rule out as better than its pick (verdict.pick.rival: the highest pooled estimate credited RIVAL_Z
standard errors, when that reaches the pick's), in place of the adaptive-or-fixed step control, so the night
measures no more arms than its plan held seats for (verdict.schedule.candidate_arms). On a short night the pick and the optimum are often a
near-tie measured once each; the rounds settle it (bench/short_night.py, docs/benchmarks.md). In-process on
the model-backed executor: real Optuna, MLflow sqlite and registry."""

from __future__ import annotations

from pathlib import Path

import yaml
from e2e_helpers import demo_experiment, write_experiment
from loop_helpers import near_tie, run_sweep
from mlflow_fixtures import sqlite_store_template  # noqa: F401 (fixture)
from outcome_helpers import searched

from orchestrator.config import experiment as spec_mod
from orchestrator.records import prefill_group
from orchestrator.results import select, truth
from orchestrator.search import space as sp
from orchestrator.verdict import pick, schedule
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
    # The rival took the step control's seat: no adaptive or fixed arm, and each round measured no more
    # arms than the plan held seats for (the rival in every round of the gate's pair up to min_rounds).
    assert set(measured) == {"champion", "baseline", "runner_up"}, sorted(measured)
    by_round: dict[int, set[str]] = {}
    for who, rows in measured.items():
        for r in rows:
            by_round.setdefault(r, set()).add(who)
    assert all(len(arms) <= len(planned) for arms in by_round.values()), by_round
    assert all(r in measured["runner_up"] for r in range(spec.promotion.min_rounds)), measured["runner_up"]
    champion = summary.champion or {}
    deployed = summary.deployed or {}
    value = truth.evaluator(spec)  # the simulator's noise-free model
    searched = value(sp.complete(spec.space, champion["params"]))
    shipped = value(sp.complete(spec.space, deployed["params"]))
    # The seeded pick (4 draft steps) and its rival (2 steps: truly 14% faster, by the simulator's model) were
    # measured once each in the search at 6% noise; in the same rounds the rival wins and is deployed.
    assert summary.promoted and summary.promoted_config == "runner_up", summary.verdict
    # Each run's own speed is taken out of the two (verdict.speed) only where they prefill alike, and the
    # verdict claims it only then (here the rival is 2 steps under other NCCL settings: not adjusted).
    alike = prefill_group(champion["params"]) == prefill_group(deployed["params"])
    assert not alike and "each run's own speed taken out" not in (summary.verdict or ""), summary.verdict
    assert all("ttft_ms_p50" in row for rows in measured.values() for row in rows.values())
    assert distance(champion["params"], deployed["params"]) >= 1
    assert shipped > searched


def test_the_rival_is_the_point_the_search_can_least_rule_out():
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
        searched(1, 100.0, a),
        searched(2, 99.0, near),
        searched(3, 97.0, {**a, "NCCL_PROTO": None}),
        searched(4, 96.0, {**near, "NCCL_PROTO": None}),
        searched(6, 96.0, a),
        searched(7, 95.0, near),
        searched(5, 95.0, {**tree, "NCCL_PROTO": None}),
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
    slow = [searched(1, 100.0, a), searched(2, 80.0, near), searched(3, 100.5, a), searched(4, 79.0, near)]
    slow_eligible = select.eligible_values(slow, metric="decode_tok_s", constraints={})
    assert pick.rival(slow_eligible, slow[0], direction="maximize") is None


def test_the_plan_holds_one_seat_for_the_rival_or_the_step_control(tmp_path):
    """schedule.candidate_arms without promotion.explain: the gate level's step control is the seat both may
    take; the step control at another level keeps its own; where there is no step control (no speculation
    in the space, or an SGLang version without --speculative-adaptive) the rival has a seat of its own."""
    chain = tmp_path / "chain.yaml"
    chain.write_text(
        yaml.safe_dump(
            {
                "name": "chain",
                "params": {
                    "NCCL_PROTO": {"choices": [None, "LL"]},
                    "speculative_algorithm": {"choices": [None, "EAGLE3"]},
                    "speculative_num_steps": {"choices": [2, 3], "when": {"speculative_algorithm": "EAGLE3"}},
                },
            }
        )
    )
    nccl_only = tmp_path / "nccl.yaml"
    nccl_only.write_text(yaml.safe_dump({"name": "nccl", "params": {"NCCL_PROTO": {"choices": [None, "LL"]}}}))

    def planned(space: Path, version: str = "0.5.23", levels: tuple[int, ...] = ()) -> list[str]:
        data = demo_experiment(name="seats", sglang_version=version, promotion={"concurrency": list(levels)})
        data["search_space"] = [str(space)]
        spec = spec_mod.load(write_experiment(tmp_path, data, name=f"{space.stem}-{version}-{len(levels)}.yaml"))
        return [name for name, _, _ in schedule.candidate_arms(spec)]

    assert planned(chain) == ["champion", "baseline", "runner_up or steps@1"]
    assert planned(chain, levels=(1, 16)) == [
        "champion",
        "baseline",
        "runner_up or steps@1",
        "champion@16",
        "baseline@16",
        "steps@16",
    ]
    assert planned(nccl_only) == ["champion", "baseline", "runner_up"]
    assert planned(chain, version="0.5.9") == ["champion", "baseline", "runner_up"]
