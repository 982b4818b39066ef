"""Stage two's local refinement (search/refine.py) and the sampler that proposes it (search/sampler.py,
StageTwoSampler) on a real Optuna sqlite study restricted to kept NCCL settings, as a two-stage sweep
leaves it after the probe."""

from __future__ import annotations

from pathlib import Path

import pytest
from refine_helpers import CHAIN, SPACE

from orchestrator.config.experiment import ParamSpec, SamplerSpec, SearchSpace
from orchestrator.search import space as sp
from orchestrator.search.proposal import Proposal, ProposalPolicy, Settled, Settlement
from orchestrator.search.refine import Refinement, _log_means
from orchestrator.search.sampler import TPE_EVERY
from orchestrator.search.study import Study

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
TREE = {
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 2,
    "speculative_num_draft_tokens": 6,
}


@pytest.fixture
def policy() -> Refinement:
    return Refinement(SPACE, KEPT, LATENCY)


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
    measured = [(100.0, a), (99.0, b)]
    tried = {sp.key(a), sp.key(b)}
    first = policy.next(measured, tried)
    second = policy.next(measured, tried | {sp.key(first)})
    third = policy.next(measured, tried | {sp.key(first), sp.key(second)})
    assert first in policy.neighbours(a)
    assert second in policy.neighbours(b)
    assert third in policy.neighbours(a) and third != first


def test_a_knob_whose_last_step_gained_is_stepped_on_the_same_way_first(policy) -> None:
    # search/refine.py continuations: 4 draft tokens beat 2, so 6 is the next point tried from 4, before
    # every other knob's move; without the measured step behind, the list's own order holds.
    ll = KEPT["NCCL_PROTO=LL"]  # the fastest setting at verify-4: no NCCL move comes first
    two, four = {**TREE, **ll, "speculative_num_draft_tokens": 2}, {**TREE, **ll, "speculative_num_draft_tokens": 4}
    six = {**four, "speculative_num_draft_tokens": 6}
    measured = [(90.0, two), (100.0, four), (101.0, four)]
    assert policy.next(measured, {sp.key(two), sp.key(four)}) == six
    assert policy.neighbours(four)[0] != six  # the order comes from the measurement, not the list
    # the other way round: 6 measured below 4, so from 4 the walk goes on down, to 2, once
    down = policy.neighbours(four, _log_means([(100.0, four), (95.0, six)]))
    assert down[0] == two and sorted(map(sp.key, down)) == sorted(map(sp.key, policy.neighbours(four)))
    # steps: 3 beat 2, so 4 comes first
    two_steps = {**CHAIN, **ll, "speculative_num_steps": 2}
    three_steps = {**two_steps, "speculative_num_steps": 3}
    got = policy.neighbours(three_steps, _log_means([(95.0, two_steps), (100.0, three_steps)]))
    assert got[0] == {**two_steps, "speculative_num_steps": 4}


def test_without_a_probe_there_is_no_fastest_setting() -> None:
    assert Refinement(SPACE, KEPT).fastest_nccl({**CHAIN, "NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": None}) is None


def _value(p: dict) -> float:
    return 100.0 + (p["speculative_num_steps"] or 0) + (5.0 if p["NCCL_PROTO"] == "LL" else 0.0)


def test_the_sampler_proposes_neighbours_through_tpes_random_start_then_two_turns_in_three(tmp_path: Path) -> None:
    """The study's own sampler, asked through the driver's policy after the measured warm start: while
    TPE would sample at random (its startup trials) every fresh proposal is an untried neighbour of the
    best measured points; after that two of every TPE_EVERY at least."""
    startup = 4
    study = Study(
        f"sqlite:///{tmp_path / 'optuna.db'}",
        "stage-two",
        SPACE,
        SamplerSpec(kind="tpe", seed=0, startup_trials=startup),
        ["maximize"],
    )
    study.open()
    study.restrict_nccl(KEPT)
    study.set_attr("probe_latency", LATENCY)
    policy = ProposalPolicy(study)
    refinement = Refinement(SPACE, KEPT, LATENCY)
    study.enqueue({**CHAIN, **KEPT["NCCL_PROTO=LL"]}, {"role": "search", "warm_start": 1})
    measured: list[tuple[float, dict]] = []
    during_start: list[bool] = []
    after_start: list[bool] = []
    for _ in range(startup + 3 * TPE_EVERY):
        got = policy.next()
        if isinstance(got, Settled):  # TPE's repeat of a measured point, settled without a launch
            assert got.how is Settlement.duplicate_of_complete and len(measured) >= startup
            continue
        assert isinstance(got, Proposal)
        if "warm_start" not in got.attrs:
            ranked = sorted(measured, key=lambda m: -m[0])
            near = any(got.params in refinement.neighbours(p) for _, p in ranked[:2])
            (during_start if len(measured) < startup else after_start).append(near)
        value = _value(got.params)
        study.tell_complete(got.number, [value], {})
        policy.remember(got.params, got.number, [value])
        measured.append((value, got.params))
    assert during_start and all(during_start)
    assert sum(after_start) >= 2 * (len(after_start) // TPE_EVERY)
    assert len({sp.key(p) for _, p in measured}) == len(measured)  # the refinement never repeats a point


def test_kept_settings_are_asked_only_where_the_nccl_knobs_are_active(tmp_path: Path) -> None:
    """The communication path's collapse (search.space.collapse_inert) leaves the NCCL knobs active only
    under all_reduce_path nccl on a host whose decode all-reduces NCCL does not carry (H200): a trial
    elsewhere carries no NCCL setting, and the refinement makes no NCCL move there."""
    space = SearchSpace(
        name="collapsed",
        params={
            "NCCL_PROTO": ParamSpec(choices=(None, "LL", "Simple"), when={"all_reduce_path": "nccl"}),
            "NCCL_MAX_NCHANNELS": ParamSpec(choices=(None, 2, 4), when={"all_reduce_path": "nccl"}),
            "all_reduce_path": ParamSpec(choices=(None, "nccl")),
            "speculative_algorithm": ParamSpec(choices=(None, "EAGLE3")),
        },
    )
    study = Study(
        f"sqlite:///{tmp_path / 'optuna.db'}", "collapsed", space, SamplerSpec(kind="random", seed=0), ["maximize"]
    )
    study.open()
    study.restrict_nccl(KEPT)
    seen = {None: 0, "nccl": 0}
    for _ in range(12):
        asked = study.ask()
        assert asked is not None
        number, params, _ = asked
        seen[params["all_reduce_path"]] += 1
        if params["all_reduce_path"] is None:
            assert params["NCCL_PROTO"] is None and params["NCCL_MAX_NCHANNELS"] is None
            assert "probe.nccl_rank" not in study.study.get_trials(deepcopy=False)[number].params
        else:
            assert {k: params[k] for k in ("NCCL_PROTO", "NCCL_MAX_NCHANNELS")} in KEPT.values()
        study.tell_complete(number, [1.0], {})
    assert seen[None] and seen["nccl"]
    plain = {"NCCL_PROTO": None, "NCCL_MAX_NCHANNELS": None, "all_reduce_path": None, "speculative_algorithm": None}
    moves = Refinement(space, KEPT, LATENCY).neighbours(plain)
    assert moves and all(
        p["NCCL_PROTO"] is None and p["NCCL_MAX_NCHANNELS"] is None for p in moves if p["all_reduce_path"] is None
    )
