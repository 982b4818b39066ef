"""The proposal policy on a real Optuna sqlite study: what needs no launch is told, not returned."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.experiment import ParamSpec, SamplerSpec, SearchSpace
from orchestrator.search import space as sp
from orchestrator.search.proposal import Proposal, ProposalPolicy, Settled, Settlement
from orchestrator.search.study import Study

SPACE = SearchSpace(
    name="eagle",
    params={
        "speculative_algorithm": ParamSpec(choices=(None, "EAGLE3")),
        "speculative_num_steps": ParamSpec(choices=(None, 1, 3)),
        "speculative_eagle_topk": ParamSpec(choices=(None, 1, 2)),
        "speculative_num_draft_tokens": ParamSpec(choices=(None, 2, 4, 8)),
    },
)
FEASIBLE = {
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}


@pytest.fixture
def study(tmp_path: Path) -> Study:
    s = Study(f"sqlite:///{tmp_path / 'optuna.db'}", "policy", SPACE, SamplerSpec(kind="random", seed=0), ["maximize"])
    s.open()
    return s


def next_of(
    policy: ProposalPolicy, study: Study, params: dict, role: str = "search", in_flight: dict[str, int] | None = None
) -> Proposal | Settled | None:
    study.enqueue(params, {"role": role})
    return policy.next(in_flight)


def state_of(study: Study, number: int) -> tuple[str, tuple[float, ...] | None, dict]:
    t = study.trials()[number]
    return t.state, t.values, t.attrs


def test_a_feasible_new_point_is_proposed(study: Study) -> None:
    got = next_of(ProposalPolicy(study), study, FEASIBLE)
    assert isinstance(got, Proposal) and got.params == FEASIBLE and got.role == "search"
    assert state_of(study, got.number)[0] == "RUNNING"


def test_an_infeasible_point_is_told_as_failed_with_its_rule(study: Study) -> None:
    bad = {**FEASIBLE, "speculative_num_draft_tokens": 8}
    got = next_of(ProposalPolicy(study), study, bad)
    assert isinstance(got, Settled) and got.how is Settlement.infeasible
    assert "top-k 1 forces draft tokens = steps + 1 = 4, but got 8" in got.detail
    state, _, attrs = state_of(study, got.number)
    assert state == "FAIL" and attrs["failure_kind"] == "infeasible" and attrs["skipped"] is True
    assert attrs["reason"] == got.detail


def test_a_repeat_of_a_measured_point_is_told_its_values_again(study: Study) -> None:
    policy = ProposalPolicy(study)
    first = next_of(policy, study, FEASIBLE)
    assert isinstance(first, Proposal)
    study.tell_complete(first.number, [42.0], {})
    policy.remember(first.params, first.number, [42.0])
    again = next_of(policy, study, FEASIBLE)
    assert isinstance(again, Settled) and again.how is Settlement.duplicate_of_complete
    assert state_of(study, again.number)[:2] == ("COMPLETE", (42.0,))
    assert state_of(study, again.number)[2]["duplicate_of"] == first.number


def test_a_repeat_of_a_failed_point_is_told_the_failure(study: Study) -> None:
    policy = ProposalPolicy(study)
    policy.remember(FEASIBLE, 7, None)
    got = next_of(policy, study, FEASIBLE)
    assert isinstance(got, Settled) and got.how is Settlement.duplicate_of_failed
    state, _, attrs = state_of(study, got.number)
    assert state == "FAIL" and attrs["failure_kind"] == "duplicate_of_failed"
    assert attrs["reason"] == "same parameters as failed trial 7"


def test_a_repeat_of_a_point_in_flight_is_dropped(study: Study) -> None:
    got = next_of(ProposalPolicy(study), study, FEASIBLE, in_flight={sp.key(FEASIBLE): 3})
    assert isinstance(got, Settled) and got.how is Settlement.duplicate_of_running
    assert state_of(study, got.number)[2]["reason"] == "same parameters as trial 3, in flight"


def test_a_baseline_is_measured_again_even_when_its_point_was_measured(study: Study) -> None:
    policy = ProposalPolicy(study)
    baseline = sp.baseline_params(SPACE)
    policy.remember(baseline, 0, [10.0])
    got = next_of(policy, study, baseline, role="baseline")
    assert isinstance(got, Proposal) and got.role == "baseline"
