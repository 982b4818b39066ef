"""Stage two's local refinement (search/proposal.py) on a real Optuna sqlite study restricted to kept
NCCL settings, as a two-stage sweep leaves it after the probe."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.experiment import ParamSpec, SamplerSpec, SearchSpace
from orchestrator.search import space as sp
from orchestrator.search.proposal import ProposalPolicy
from orchestrator.search.study import Study

SPACE = SearchSpace(name="two-stage", params={
    "NCCL_PROTO": ParamSpec(choices=(None, "LL", "Simple")),
    "NCCL_MAX_NCHANNELS": ParamSpec(choices=(None, 2, 4)),
    "speculative_algorithm": ParamSpec(choices=(None, "EAGLE3")),
    "speculative_num_steps": ParamSpec(low=1, high=4, when={"speculative_algorithm": "EAGLE3"}),
    "speculative_eagle_topk": ParamSpec(choices=(1, 2), when={"speculative_algorithm": "EAGLE3"}),
    "speculative_num_draft_tokens": ParamSpec(choices=(2, 4, 6), when={"speculative_eagle_topk": 2}),
})
KEPT = {
    "NCCL_PROTO=LL": {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": None},
    "NCCL_PROTO=LL NCCL_MAX_NCHANNELS=4": {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": 4},
    "NCCL defaults": {"NCCL_PROTO": None, "NCCL_MAX_NCHANNELS": None},
}
# Probe medians (us): channels 4 wins at 6 draft tokens, plain LL at 2 and 4.
LATENCY = {
    "NCCL_PROTO=LL": {"decode": 20.0, "verify-2": 22.0, "verify-4": 25.0, "verify-6": 40.0},
    "NCCL_PROTO=LL NCCL_MAX_NCHANNELS=4": {"decode": 21.0, "verify-2": 23.0, "verify-4": 26.0, "verify-6": 30.0},
    "NCCL defaults": {"decode": 50.0, "verify-2": 55.0, "verify-4": 60.0, "verify-6": 70.0},
}
CHAIN = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
         "speculative_num_draft_tokens": None}
TREE = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 2,
        "speculative_num_draft_tokens": 6}


@pytest.fixture
def policy(tmp_path: Path) -> ProposalPolicy:
    study = Study(f"sqlite:///{tmp_path / 'optuna.db'}", "refine", SPACE, SamplerSpec(kind="tpe", seed=0),
                  ["maximize"])
    study.open()
    study.restrict_nccl(KEPT)
    study.set_attr("probe_latency", LATENCY)
    return ProposalPolicy(study)


def test_the_first_neighbour_is_the_point_under_the_nccl_setting_fastest_at_its_verify_size(policy) -> None:
    at_ll = {**TREE, **KEPT["NCCL_PROTO=LL"]}
    assert policy.fastest_nccl(at_ll) == KEPT["NCCL_PROTO=LL NCCL_MAX_NCHANNELS=4"]  # verify-6
    assert policy.neighbours(at_ll)[0] == {**TREE, **KEPT["NCCL_PROTO=LL NCCL_MAX_NCHANNELS=4"]}
    chain = {**CHAIN, **KEPT["NCCL defaults"]}  # top-k 1, 3 steps: verify-4
    assert policy.fastest_nccl(chain) == KEPT["NCCL_PROTO=LL"]
    assert policy.neighbours(chain)[0] == {**CHAIN, **KEPT["NCCL_PROTO=LL"]}


def test_speculation_moves_come_before_nccl_rank_moves(policy) -> None:
    point = {**CHAIN, **KEPT["NCCL_PROTO=LL"]}  # already the fastest setting: no such first neighbour
    got = policy.neighbours(point)
    spec_moves = [i for i, p in enumerate(got) if p["NCCL_PROTO"] == "LL" and p["NCCL_MAX_NCHANNELS"] is None]
    rank_moves = [i for i, p in enumerate(got) if (p["NCCL_PROTO"], p["NCCL_MAX_NCHANNELS"]) != ("LL", None)]
    assert spec_moves and rank_moves and max(spec_moves) < min(rank_moves)
    assert {**point, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 4} in got  # mid-list
    assert all(sp.infeasible_reason(p) is None for p in got)


def test_the_two_best_points_take_turns(policy) -> None:
    a = {**CHAIN, **KEPT["NCCL_PROTO=LL"]}
    b = {**TREE, **KEPT["NCCL_PROTO=LL NCCL_MAX_NCHANNELS=4"]}
    policy.remember(a, 1, [100.0])
    policy.remember(b, 2, [99.0])
    first, second, third = (policy._next_neighbour(set()) for _ in range(3))
    assert first in policy.neighbours(a)
    assert second in policy.neighbours(b)
    assert third in policy.neighbours(a) and third != first


def test_without_a_probe_there_is_no_fastest_setting(tmp_path: Path) -> None:
    study = Study(f"sqlite:///{tmp_path / 'optuna.db'}", "plain", SPACE, SamplerSpec(kind="tpe", seed=0),
                  ["maximize"])
    study.open()
    assert ProposalPolicy(study).fastest_nccl({**CHAIN, "NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": None}) is None
