"""The speculation part is judged against SGLang's own default for the model as well as against the best
speculating trial (issue 33): a champion that does not speculate is measured with both on top of its NCCL
settings, and the verdict names which is which. The arms come from the verdict's pick through its port,
here a fake night that holds only the experiment and the trials measured (verdict.port.Port: the rounds are
not run)."""

from __future__ import annotations

from pathlib import Path

import yaml
from e2e_helpers import demo_experiment, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.records import Metrics, TrialOutcome, TrialRole, TrialStatus
from orchestrator.verdict import arms, choose
from orchestrator.verdict.steps import Champion

SYS = {"NCCL_P2P_LEVEL": "SYS"}
ONE_STEP = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 1, "speculative_eagle_topk": 1}


class FakeNight:
    """The part of the port the pick reads: the experiment and the trials measured."""

    def __init__(self, spec: spec_mod.SweepSpec, outcomes: list[TrialOutcome]) -> None:
        self.spec = spec
        self.outcomes = outcomes


def _spec(tmp_path: Path) -> spec_mod.SweepSpec:
    space = tmp_path / "space.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "name": "spec-default",
                "params": {
                    "NCCL_P2P_LEVEL": {"choices": [None, "SYS"]},
                    "speculative_algorithm": {"choices": [None, "EAGLE3"]},
                    "speculative_num_steps": {"choices": [1, 3], "when": {"speculative_algorithm": "EAGLE3"}},
                    "speculative_eagle_topk": {"choices": [1], "when": {"speculative_algorithm": "EAGLE3"}},
                    "speculative_num_draft_tokens": {"choices": [2, 4], "when": {"speculative_algorithm": "EAGLE3"}},
                },
            }
        )
    )
    data = demo_experiment(name="spec-default", promotion={"explain": True})
    data["search_space"] = [str(space)]
    return spec_mod.load(write_experiment(tmp_path, data))


def _trial(number: int, value: float, params: dict, role: TrialRole = TrialRole.search) -> TrialOutcome:
    return TrialOutcome(
        number=number,
        params=params,
        role=role,
        status=TrialStatus.COMPLETE,
        metrics=Metrics(decode_tok_s=value, output_tok_s=value),
        effective_env={"ok": True},
    )


def test_a_champion_without_speculation_is_measured_with_the_best_trials_and_sglangs_default(tmp_path):
    spec = _spec(tmp_path)
    baseline = _trial(0, 60.0, {}, TrialRole.baseline)
    champion = _trial(1, 90.0, SYS)  # NCCL alone won
    one_step = _trial(2, 85.0, {**SYS, **ONE_STEP, "speculative_num_draft_tokens": 2})  # one poor setting tried
    night = FakeNight(spec, [baseline, champion, one_step])
    measuring = arms.arms(night, Champion(trial=champion, baseline=baseline, run_id="r", metric="decode_tok_s"))  # type: ignore[arg-type]
    by_name = {a.name: a for a in measuring.arms}
    assert by_name["with_speculation"].params["speculative_num_steps"] == 1  # the best speculating trial's
    default = by_name["with_default_speculation"].params  # the model profile's default: 3 steps, top-k 1, 4 drafts
    assert default["NCCL_P2P_LEVEL"] == "SYS" and default["speculative_algorithm"] == "EAGLE3"
    assert (default["speculative_num_steps"], default["speculative_eagle_topk"]) == (3, 1)
    assert default["speculative_num_draft_tokens"] == 4

    # The verdict's parts say which is which (values as the rounds would hand them back).
    values = {
        "champion": {0: 90.0, 1: 90.5, 2: 89.8},
        "baseline": {0: 60.0, 1: 60.2, 2: 59.9},
        "with_speculation": {0: 80.0, 1: 80.3, 2: 79.9},
        "with_default_speculation": {0: 97.0, 1: 97.6, 2: 97.2},
    }
    parts = choose.contributions(values, speculation="EAGLE-3", sole_part="NCCL settings", direction="maximize")
    named = {p.a: p for p in parts}
    assert named["with_speculation"].part.endswith("(the best speculating trial's settings)")
    assert named["with_speculation"].interval.gain < 0
    assert named["with_default_speculation"].part.endswith("(SGLang's default for the model)")
    assert named["with_default_speculation"].interval.gain > 0.05


def test_no_second_arm_when_the_best_trial_is_the_default(tmp_path):
    spec = _spec(tmp_path)
    baseline = _trial(0, 60.0, {}, TrialRole.baseline)
    champion = _trial(1, 90.0, SYS)
    default = _trial(2, 88.0, {**SYS, **ONE_STEP, "speculative_num_steps": 3, "speculative_num_draft_tokens": 4})
    night = FakeNight(spec, [baseline, champion, default])
    measuring = arms.arms(night, Champion(trial=champion, baseline=baseline, run_id="r", metric="decode_tok_s"))  # type: ignore[arg-type]
    names = [a.name for a in measuring.arms]
    assert "with_speculation" in names and "with_default_speculation" not in names
