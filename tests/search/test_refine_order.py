"""The order of stage two's refinement on a short night (issue 34): a speculation shape nothing measured
comes before the same shape under another NCCL setting, switching speculation off comes after the moves
within it, a refused point slower than the best is no lead, and TPE's turns wait for points the sampler
chose itself (search/refine.py, search/sampler.py)."""

from __future__ import annotations

from pathlib import Path

from refine_helpers import CHAIN, SPACE

from orchestrator.config.experiment import SamplerSpec
from orchestrator.records import split_point
from orchestrator.search import space as sp
from orchestrator.search.proposal import Proposal, ProposalPolicy
from orchestrator.search.refine import SHORT_SEARCH, Refinement
from orchestrator.search.regions import REFUSED, Region
from orchestrator.search.study import Study

KEPT = {
    "LL": {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": None},
    "LL 4": {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": 4},
    "Simple": {"NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": None},
}
LATENCY = {  # LL fastest at every size: the best point is already under its fastest setting
    "LL": {"decode": 20.0, "verify-4": 25.0, "verify-6": 30.0},
    "LL 4": {"decode": 21.0, "verify-4": 26.0, "verify-6": 31.0},
    "Simple": {"decode": 40.0, "verify-4": 45.0, "verify-6": 50.0},
}
OFF = {k: None for k in CHAIN}


def _shape(p: dict) -> tuple:
    return split_point(p)[0]


def test_new_speculation_shapes_come_before_the_warm_shape_under_other_settings() -> None:
    """A warm start of one shape under three settings: the refinement's next proposals are shapes nothing
    measured (the warm start's shape under another setting only once those are used up), each knob moved
    once before one is moved again (breadth first)."""
    warm = [{**CHAIN, **KEPT[label]} for label in KEPT]
    measured = [(100.0, warm[0]), (99.5, warm[1]), (90.0, warm[2])]
    policy = Refinement(SPACE, KEPT, LATENCY)
    tried = {sp.key(p) for p in warm}
    shapes, points = [_shape(CHAIN)], list(warm)
    for _ in range(3):
        got = policy.next(measured, tried, (), points)  # proposed ones stay in flight: unmeasured
        assert got is not None and _shape(got) not in shapes
        shapes.append(_shape(got))
        tried.add(sp.key(got))
        points.append(got)
    steps4, steps2 = {**CHAIN, "speculative_num_steps": 4}, {**CHAIN, "speculative_num_steps": 2}
    tree = {**CHAIN, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 4}
    # the best's first move; the runner-up's along a knob not moved yet (top-k), not steps again; then steps
    assert shapes[1:] == [_shape(steps4), _shape(tree), _shape(steps2)]


def test_switching_speculation_off_comes_after_the_moves_within_it() -> None:
    point = {**CHAIN, **KEPT["LL"]}
    got = Refinement(SPACE, KEPT, LATENCY).neighbours(point)
    off = got.index({**point, **OFF})
    tree = got.index({**point, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 4})
    steps = [got.index({**point, "speculative_num_steps": n}) for n in (2, 4)]
    assert max(steps) < off and tree < off
    without = Refinement(SPACE, {}, {}).neighbours(point)  # the same order without a probe
    assert without.index({**point, **OFF}) == len(without) - 1


def test_a_refused_point_slower_than_the_best_is_no_lead() -> None:
    """The edge of a region the correctness screen marked is explored where the refused point measured
    faster than the best measured point; a slower one is only avoided."""
    best = {**CHAIN, **KEPT["LL"]}
    refused = {**OFF, "NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": 2}
    region = Region(REFUSED, refused, 7)
    policy = Refinement(SPACE, KEPT, LATENCY)
    edge = region.edge(SPACE, KEPT)
    assert edge
    tried = {sp.key(best), sp.key(refused)}
    assert policy.next([(100.0, best)], tried, [region]) == edge[0]
    got = policy.next([(100.0, best)], tried, [region], [best, refused], slow=[7])
    assert got is not None and got != edge[0] and not region.holds(got)


def test_tpe_waits_for_points_the_sampler_chose_itself(tmp_path: Path) -> None:
    """Baseline and warm start are enqueued: they do not count towards TPE's start, so the first
    `startup_trials` fresh proposals after them are all the refinement's (untried neighbours of the best)."""
    startup = 3
    study = Study(
        f"sqlite:///{tmp_path / 'optuna.db'}",
        "short",
        SPACE,
        SamplerSpec(kind="tpe", seed=0, startup_trials=startup),
        ["maximize"],
        11,  # budget.trials of a short night (refine.SHORT_SEARCH)
    )
    study.open()
    study.restrict_nccl(KEPT)
    study.set_attr("probe_latency", LATENCY)
    study.enqueue({**OFF, "NCCL_PROTO": None, "NCCL_MAX_NCHANNELS": None}, {"role": "baseline"})
    for rank, label in enumerate(KEPT):
        study.enqueue({**CHAIN, **KEPT[label]}, {"role": "search", "warm_start": rank + 1})
    policy = ProposalPolicy(study)
    refinement = Refinement(SPACE, KEPT, LATENCY)
    measured: list[tuple[float, dict]] = []
    fresh: list[bool] = []
    for _ in range(4 + startup):
        got = policy.next()
        assert isinstance(got, Proposal)
        if got.role == "search" and "warm_start" not in got.attrs:
            ranked = [p for _, p in sorted(measured, key=lambda m: -m[0])]
            fresh.append(any(got.params in refinement.neighbours(p) for p in ranked))
        value = 100.0 + (got.params["speculative_num_steps"] or 0) - (got.params["NCCL_PROTO"] is None) * 20
        study.tell_complete(got.number, [value], {})
        policy.remember(got.params, got.number, [value])
        measured.append((value, got.params))
    assert len(fresh) == startup and all(fresh)


def test_a_long_search_keeps_the_plain_order_and_a_short_one_goes_breadth_first(tmp_path: Path) -> None:
    """refine.SHORT_SEARCH: only a search of at most that many trials (budget.trials, which the driver hands
    the Study) goes breadth first; a longer night's refinement takes the first open neighbour of the best
    point in the plain order: the warm shape under the next kept setting, before any new shape."""
    warm = [{**CHAIN, **KEPT[label]} for label in KEPT]
    measured = [(100.0, warm[0]), (99.5, warm[1])]  # "Simple" not measured yet: the plain order tries it
    tried = {sp.key(p) for p in warm[:2]}
    plain = Refinement(SPACE, KEPT, LATENCY, breadth=False).next(measured, tried, (), warm[:2])
    short = Refinement(SPACE, KEPT, LATENCY).next(measured, tried, (), warm[:2])
    assert plain is not None and short is not None
    assert _shape(short) != _shape(CHAIN)  # a new shape first
    assert _shape(plain) == _shape(CHAIN) or plain != short  # the plain order is not the breadth-first one
    url = f"sqlite:///{tmp_path / 'o.db'}"
    for trials, breadth in ((SHORT_SEARCH, True), (SHORT_SEARCH + 1, False), (None, False)):
        study = Study(url, f"s{trials}", SPACE, SamplerSpec(kind="tpe", seed=0), ["maximize"], trials)
        study.open()
        assert study._study is not None and study._study.sampler._breadth is breadth  # type: ignore[attr-defined]
