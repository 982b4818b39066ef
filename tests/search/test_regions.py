"""Failures as information (issue 34, search/regions.py): a failed trial marks a region whose core the
search does not launch again and whose edge it explores next; the correctness screen's refusals count as
infeasible; the probe's kept set keeps safe settings beside the ones the screen will refuse."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml

from orchestrator.config import experiment as spec_mod
from orchestrator.config.experiment import ParamSpec, SamplerSpec, SearchSpace
from orchestrator.probe import rank_settings, run_probe
from orchestrator.search import space as sp
from orchestrator.search.proposal import Proposal, ProposalPolicy, Settled, Settlement
from orchestrator.search.refine import Refinement
from orchestrator.search.regions import Region, regions_of
from orchestrator.search.study import Study
from orchestrator.sweep._probe_stage import DEFAULTS_LABEL, kept_settings, screen_refuses, warm_start

SPACE = SearchSpace(
    name="regions",
    params={
        "NCCL_PROTO": ParamSpec(choices=(None, "LL", "LL128", "Simple")),
        "NCCL_MAX_NCHANNELS": ParamSpec(choices=(None, 2, 4)),
        "speculative_algorithm": ParamSpec(choices=(None, "EAGLE3")),
        "speculative_num_steps": ParamSpec(low=1, high=4, when={"speculative_algorithm": "EAGLE3"}),
        "speculative_eagle_topk": ParamSpec(choices=(1, 2, 4), when={"speculative_algorithm": "EAGLE3"}),
        "speculative_num_draft_tokens": ParamSpec(choices=(2, 4, 5, 6, 8), when={"speculative_eagle_topk": [2, 4]}),
    },
)
KEPT = {  # fastest first, as the probe ranks them
    "NCCL_PROTO=LL NCCL_MAX_NCHANNELS=4": {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": 4},
    "NCCL_PROTO=LL": {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": None},
    "NCCL_PROTO=Simple": {"NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": None},
    "NCCL defaults": {"NCCL_PROTO": None, "NCCL_MAX_NCHANNELS": None},
}
TREE = {
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 2,
    "speculative_num_draft_tokens": 6,
}
PLAIN = {
    "speculative_algorithm": None,
    "speculative_num_steps": None,
    "speculative_eagle_topk": None,
    "speculative_num_draft_tokens": None,
}
LL4 = KEPT["NCCL_PROTO=LL NCCL_MAX_NCHANNELS=4"]


def point(*parts: dict) -> dict:
    out: dict = {}
    for p in parts:
        out.update(p)
    return sp.complete(SPACE, out)


@pytest.mark.parametrize(
    ("region", "other", "held"),
    [
        # out of memory: the same top-k with as many draft tokens or more, under any NCCL setting
        (Region("oom", point(TREE, LL4), 5), point(TREE, KEPT["NCCL defaults"]), True),
        (Region("oom", point(TREE, LL4), 5), point(TREE, {"speculative_num_draft_tokens": 8}), True),
        (Region("oom", point(TREE, LL4), 5), point(TREE, LL4, {"speculative_num_draft_tokens": 5}), False),
        (Region("oom", point(TREE, LL4), 5), point(TREE, LL4, {"speculative_eagle_topk": 4}), False),
        (Region("oom", point(TREE, LL4), 5), point(PLAIN, LL4), False),
        # a hang: the same NCCL setting, speculating as it did, whatever the shape
        (Region("nccl_hang", point(TREE, LL4), 5), point(TREE, LL4, {"speculative_num_draft_tokens": 2}), True),
        (Region("nccl_hang", point(TREE, LL4), 5), point(PLAIN, LL4), False),
        (Region("nccl_hang", point(TREE, LL4), 5), point(TREE, KEPT["NCCL_PROTO=LL"]), False),
        # changed outputs under a forced protocol: that protocol everywhere, speculating as it did
        (
            Region("outputs_changed", point(TREE, {"NCCL_PROTO": "LL128"}), 5),
            point(TREE, {"NCCL_PROTO": "LL128", "NCCL_MAX_NCHANNELS": 2, "speculative_num_draft_tokens": 4}),
            True,
        ),
        (Region("outputs_changed", point(TREE, {"NCCL_PROTO": "LL128"}), 5), point(TREE, LL4), False),
        # any other failure stays a point
        (Region("server_crash", point(TREE, LL4), 5), point(TREE, KEPT["NCCL defaults"]), False),
    ],
)
def test_a_failure_holds_its_region_not_only_its_point(region: Region, other: dict, held: bool) -> None:
    assert region.holds(region.point)
    assert region.holds(other) is held


def test_the_edge_of_a_failure_is_one_draft_token_fewer_the_next_protocol_or_no_speculation() -> None:
    oom = Region("oom", point(TREE, LL4), 5)
    assert oom.edge(SPACE, KEPT) == [point(TREE, LL4, {"speculative_num_draft_tokens": 5})]
    chain = point(TREE, LL4, {"speculative_eagle_topk": 1, "speculative_num_draft_tokens": None})
    assert Region("oom", chain, 5).edge(SPACE, KEPT) == [point(chain, {"speculative_num_steps": 2})]
    hang = Region("nccl_hang", point(TREE, LL4), 5)
    assert hang.edge(SPACE, KEPT) == [point(TREE, KEPT["NCCL_PROTO=Simple"]), point(PLAIN, LL4)]
    refused = Region("outputs_changed", point(TREE, {"NCCL_PROTO": "LL128"}), 5)
    assert refused.edge(SPACE, KEPT) == [point(TREE, LL4)]


def test_the_refinement_starts_from_the_latest_failure_and_never_proposes_its_core() -> None:
    refinement = Refinement(SPACE, KEPT)
    best = point(TREE, KEPT["NCCL_PROTO=LL"], {"speculative_num_draft_tokens": 4})
    failed = point(TREE, LL4)
    tried = {sp.key(best), sp.key(failed)}
    regions = [Region("oom", failed, 2)]
    first = refinement.next([(90.0, best)], tried, regions)
    assert first == point(TREE, LL4, {"speculative_num_draft_tokens": 5})  # the edge, before any neighbour
    tried.add(sp.key(first))
    for _ in range(12):
        nxt = refinement.next([(90.0, best)], tried, regions)
        if nxt is None:
            break
        assert not regions[0].holds(nxt), nxt  # never 6 draft tokens or more at top-k 2
        tried.add(sp.key(nxt))


def _study(tmp_path: Path) -> Study:
    study = Study(
        f"sqlite:///{tmp_path / 'optuna.db'}", "regions", SPACE, SamplerSpec(kind="random", seed=0), ["maximize"]
    )
    study.open()
    return study


def test_a_shape_that_ran_out_of_memory_is_not_launched_under_another_nccl_setting(tmp_path: Path) -> None:
    study = _study(tmp_path)
    policy = ProposalPolicy(study)
    study.enqueue(point(TREE, LL4), {"role": "search"})
    first = policy.next()
    assert isinstance(first, Proposal)
    study.tell_failed(first.number, {"failure_kind": "oom", "reason": "CUDA out of memory"}, learn=True)
    policy.remember(first.params, first.number, None, learn=True)
    study.enqueue(point(TREE, KEPT["NCCL defaults"]), {"role": "search"})  # the same shape, NCCL defaults
    second = policy.next()
    assert isinstance(second, Settled) and second.how is Settlement.in_failed_region
    assert second.detail == f"in the region where trial {first.number} ran out of memory (oom)"
    view = next(t for t in study.trials() if t.number == second.number)
    assert view.state == "FAIL" and view.attrs["skipped"] and view.attrs["failure_kind"] == "in_failed_region"
    assert [r.number for r in regions_of(study.trials())] == [first.number]  # a settled point marks nothing
    study.enqueue(point(TREE, LL4, {"speculative_num_draft_tokens": 5}), {"role": "search"})  # its edge
    assert isinstance(policy.next(), Proposal)


def test_a_point_the_screen_refused_makes_its_protocol_infeasible_to_the_sampler(tmp_path: Path) -> None:
    study = _study(tmp_path)
    policy = ProposalPolicy(study)
    study.enqueue(point(TREE, {"NCCL_PROTO": "LL128"}), {"role": "search"})
    first = policy.next()
    assert isinstance(first, Proposal)
    study.tell_complete(first.number, [120.0], {"outputs_changed": "outputs differ on 7 of 8 prompts"})
    study.enqueue(point(TREE, {"NCCL_PROTO": "LL128", "NCCL_MAX_NCHANNELS": 4}), {"role": "search"})
    second = policy.next()
    assert isinstance(second, Settled) and second.how is Settlement.in_failed_region
    assert "changed the outputs" in second.detail


def _pcie_spec(tmp: Path, faults: list) -> spec_mod.SweepSpec:
    repo = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((repo / "experiments" / "demo.yaml").read_text())
    data["search_space"] = [str(repo / "search_spaces" / "nccl.yaml"), str(repo / "search_spaces" / "eagle3.yaml")]
    data["simulator"]["faults"] = faults
    data["probe"] = {"enabled": True, "keep_within": 1.1}
    path = tmp / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return spec_mod.load(path)


def test_the_kept_set_keeps_safe_settings_beside_those_the_screen_will_refuse() -> None:
    """On the PCIe demo host, with the probe's fastest settings (NCCL_PROTO=LL, P2P over SYS) hanging in the
    probe, every setting within keep_within 1.1 of the best forces LL128, which the correctness screen
    refuses on PCIe: the fastest safe settings are kept beside them and the warm start launches those."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = _pcie_spec(Path(tmp), [{"fault": "nccl_hang_when=NCCL_PROTO:LL,NCCL_P2P_LEVEL:SYS"}])
        result = run_probe(spec, Path(tmp) / "wd", budget=spec.probe.budget)
    ranked = rank_settings(result, keep_within=spec.probe.keep_within, keep_decode=False)
    refused = screen_refuses(spec)
    within = [r.setting for r in ranked if r.kept and r.setting != DEFAULTS_LABEL]
    kept = kept_settings(spec, ranked)
    by_label = {r.setting: r for r in ranked}
    assert within and all(refused(kept[label]) for label in within)  # what the probe alone would keep
    safe = [label for label in kept if label != DEFAULTS_LABEL and not refused(kept[label])]
    assert len(safe) == 3 and all(not by_label[label].kept for label in safe)
    assert warm_start(spec, kept) == safe  # the warm start launches no setting the screen will refuse
    assert not refused({"NCCL_PROTO": "LL"}) and refused({"NCCL_PROTO": "LL128"})


class _Trial:
    def __init__(self, number: int, state: str, params: dict, **attrs: object):
        self.number, self.state, self.params, self.attrs = number, state, params, attrs


def test_two_hangs_mark_the_nccl_values_they_share_unless_a_measured_point_runs_them() -> None:
    ring4 = point(TREE, {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": 4})
    plain4 = point(PLAIN, {"NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": 4})
    third = point(TREE, {"NCCL_PROTO": "LL128", "NCCL_MAX_NCHANNELS": 4})
    hangs = [_Trial(1, "FAIL", ring4, failure_kind="nccl_hang"), _Trial(2, "FAIL", plain4, failure_kind="nccl_hang")]
    found = regions_of([_Trial(0, "COMPLETE", point(PLAIN)), *hangs])
    assert [r.shared for r in found if r.shared] == [(("NCCL_MAX_NCHANNELS", 4),)]
    assert any(r.holds(third) for r in found)  # 4 channels hung twice, whatever the protocol
    measured = _Trial(3, "COMPLETE", point(PLAIN, {"NCCL_MAX_NCHANNELS": 4}))
    assert not any(r.shared for r in regions_of([*hangs, measured]))  # 4 channels ran there: not the cause
