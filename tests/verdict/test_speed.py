"""The choice between the search's pick and its runner-up (or rival) is made on the rounds' values less each
run's own speed (verdict.gate.run_speed_adjusted, its arms from verdict.steps.Arms.adjustable): a server run that came up slow is slow at prefill and at decode alike, so at
one stream its TTFT tells its speed apart from its configuration (results.select.run_speed's regression
adjustment, fitted on the rounds' repeats of each arm). Where TTFT does not move with decode, or the load is
one where TTFT waits for the running batch, the values stay as measured."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from e2e_helpers import demo_experiment, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.records import TrialStatus
from orchestrator.verdict import choose, gate
from orchestrator.verdict.arm import Arm
from orchestrator.verdict.promote import speed_out
from orchestrator.verdict.rounds import ConfirmationRow, Measured, ttft_of
from orchestrator.verdict.steps import Arms

LL = {"NCCL_PROTO": "LL"}
PICK = Arm("champion", {**LL, "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3}, 4, 1, main=True)
RIVAL = Arm("runner_up", {**LL, "speculative_algorithm": "EAGLE3", "speculative_num_steps": 4}, 7, 1)
BASE = Arm("baseline", {}, -1, 1, main=True)
TRUE = {"champion": 100.0, "runner_up": 103.0, "baseline": 60.0}
"""Each arm's noise-free decode tok/s: the rival is truly 3% faster than the pick."""
PREFILL_MS = {"champion": 50.0, "runner_up": 50.0, "baseline": 40.0}
"""Each arm's noise-free TTFT: the two speculating arms share their prefill (records.prefill_group)."""
SPEED = {
    "champion": (1.03, 1.02, 1.04),
    "runner_up": (0.97, 0.98, 0.96),
    "baseline": (1.00, 1.01, 0.99),
}
"""Each run's own speed: the pick's three runs came up fast, the rival's slow."""
JITTER = (1.001, 0.999, 1.0005)


def _spec(tmp_path: Path, **overrides) -> spec_mod.SweepSpec:
    return spec_mod.load(write_experiment(tmp_path, demo_experiment(**overrides)))


def _adjustable(spec: spec_mod.SweepSpec, arms: list[Arm]) -> dict:
    return Arms(tuple(arms), "", "").adjustable(spec.objective.metric, spec.benchmark.concurrency)


def _rounds(ttft_follows_speed: bool = True) -> tuple[dict[str, dict[int, float]], dict[tuple[str, int], float]]:
    values: dict[str, dict[int, float]] = {}
    ttft: dict[tuple[str, int], float] = {}
    for arm, speeds in SPEED.items():
        for i, f in enumerate(speeds):
            values.setdefault(arm, {})[i] = TRUE[arm] * f * JITTER[i]
            ttft[(arm, i)] = PREFILL_MS[arm] / (f if ttft_follows_speed else SPEED["baseline"][i])
    return values, ttft


def test_the_rival_slowed_by_its_runs_own_speed_wins_once_that_speed_is_taken_out(tmp_path):
    spec = _spec(tmp_path)
    values, ttft = _rounds()
    # As measured, the pick's fast runs hide the rival's 3%: the rounds alone keep the pick.
    assert gate.contender_wins(values, "runner_up", direction="maximize") is None
    fair, covariate = gate.run_speed_adjusted(values, ttft, _adjustable(spec, [PICK, RIVAL, BASE]))
    assert covariate is not None and covariate.applied and covariate.slope == pytest.approx(-1.0, abs=0.05)
    won = gate.contender_wins(fair, "runner_up", direction="maximize")
    assert won is not None and won.gain == pytest.approx(0.03, abs=0.005), won
    # Each arm is brought to its speed-free level (these runs' speeds average out at 1 within each
    # prefill group); the values as measured are left as they were.
    for arm in TRUE:
        assert math.exp(sum(math.log(v) for v in fair[arm].values()) / 3) == pytest.approx(TRUE[arm], rel=0.005)
    assert values["champion"][0] == TRUE["champion"] * SPEED["champion"][0] * JITTER[0]
    assert ", each run's own speed taken out (its TTFT, slope -0.97 +- 0.05)" == choose.speed_said(covariate)


def test_where_ttft_does_not_follow_the_run_the_values_stay_as_measured(tmp_path):
    spec = _spec(tmp_path)
    values, ttft = _rounds(ttft_follows_speed=False)
    fair, covariate = gate.run_speed_adjusted(values, ttft, _adjustable(spec, [PICK, RIVAL, BASE]))
    assert covariate is not None and not covariate.applied
    assert fair == values and choose.speed_said(covariate) == ""


def test_above_one_stream_ttft_waits_for_the_batch_and_nothing_is_adjusted(tmp_path):
    spec = _spec(tmp_path, objective={"concurrency": 8})
    assert spec.benchmark.concurrency == 8
    values, ttft = _rounds()
    at_8 = [Arm(a.name, a.params, a.number, 8, a.main) for a in (PICK, RIVAL, BASE)]
    assert _adjustable(spec, at_8) == {}
    fair, covariate = gate.run_speed_adjusted(values, ttft, _adjustable(spec, at_8))
    assert covariate is None and fair == values


def test_runs_without_a_ttft_and_arms_at_other_loads_stay_as_measured(tmp_path):
    spec = _spec(tmp_path)
    values, ttft = _rounds()
    values["champion@8"] = {0: 500.0, 1: 520.0}
    ttft.update({("champion@8", 0): 80.0, ("champion@8", 1): 60.0})
    del ttft[("runner_up", 2)]
    at_8 = Arm("champion@8", PICK.params, 4, 8)
    fair, covariate = gate.run_speed_adjusted(values, ttft, _adjustable(spec, [PICK, RIVAL, BASE, at_8]))
    assert covariate is not None and covariate.applied
    assert fair["champion@8"] == values["champion@8"]
    assert fair["runner_up"][2] == pytest.approx(values["runner_up"][2], rel=1e-12)
    assert fair["runner_up"][0] != values["runner_up"][0]


def test_a_run_s_ttft_is_kept_with_its_row_and_in_summary_json():
    rows = [
        ConfirmationRow(round=0, who="champion", status=TrialStatus.COMPLETE, concurrency=1, value=99.0, ttft_ms=51.5),
        ConfirmationRow(round=0, who="baseline", status=TrialStatus.FAILED, reason="server died"),
    ]
    assert ttft_of(rows) == {("champion", 0): 51.5}
    assert rows[0].record("decode_tok_s") == {
        "round": 0,
        "who": "champion",
        "concurrency": 1,
        "status": "COMPLETE",
        "decode_tok_s": 99.0,
        "ttft_ms_p50": 51.5,
    }


def test_the_measured_rounds_carry_the_adjusted_values_only_where_the_slope_applied(tmp_path):
    spec = _spec(tmp_path)
    arms = [PICK, RIVAL, BASE]
    for follows in (True, False):
        values, ttft = _rounds(ttft_follows_speed=follows)
        rows = tuple(
            ConfirmationRow(
                round=i, who=arm, status=TrialStatus.COMPLETE, concurrency=1, value=v, ttft_ms=ttft[(arm, i)]
            )
            for arm, row in values.items()
            for i, v in row.items()
        )
        measured = speed_out(Measured(values=values, rows=rows, decision=None, rounds=3), _adjustable(spec, arms))
        assert measured.speed is not None and measured.speed.applied is follows
        if follows:
            assert measured.fair is not None and measured.fair["runner_up"][0] > values["runner_up"][0]
        else:
            assert measured.fair is None
