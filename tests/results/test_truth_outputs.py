"""results/truth.changes_outputs: the points whose greedy outputs the simulator corrupts, which the correctness
gate refuses and so no optimum may count (bench/overnight.py's optimum leaves them out). The rule is the
simulator's (simulator/tokens.py launch_numerics: NCCL_PROTO forcing LL128 where NCCL carries a decode or
verify all-reduce on a PCIe host), modelled after NCCL's documentation of NCCL_PROTO, not measured."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from e2e_helpers import demo_experiment, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.results import truth


def _spec(tmp_path: Path, profile: str) -> spec_mod.SweepSpec:
    data = demo_experiment(name="t", simulator={"hardware_profile": profile})
    return spec_mod.load(write_experiment(tmp_path, data))


@pytest.mark.parametrize(
    ("params", "corrupts"),
    [
        ({"NCCL_PROTO": "LL128"}, True),
        (
            {
                "NCCL_PROTO": "LL128",
                "speculative_algorithm": "EAGLE3",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
            },
            True,
        ),
        ({"NCCL_PROTO": "Simple"}, False),
        ({}, False),
    ],
)
def test_forced_ll128_on_the_pcie_host_changes_the_outputs(tmp_path: Path, params: dict, corrupts: bool) -> None:
    why = truth.changes_outputs(_spec(tmp_path, "pcie-rtxpro6000-x8"))(params)
    assert bool(why) is corrupts
    if corrupts:
        assert "LL128" in why and "PCIe" in why


def test_on_nvlink_forced_ll128_keeps_the_outputs(tmp_path: Path) -> None:
    assert truth.changes_outputs(_spec(tmp_path, "h200-nvlink-x8"))({"NCCL_PROTO": "LL128"}) == ""


def test_the_optimum_a_tool_may_deploy_leaves_the_corrupting_points_out(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "pcie-rtxpro6000-x8")
    value, corrupts = truth.evaluator(spec), truth.changes_outputs(spec)
    # One pass over every 7th feasible point, each point's value and verdict once: scoring all 684,288 of
    # the demo's space took over three minutes of a loaded CI worker. The stride (prime) still meets every
    # NCCL_PROTO value, checked here, with and without speculation.
    scored = [(value(p), bool(corrupts(p)), p) for p in itertools.islice(truth.feasible_points(spec), 0, None, 7)]
    assert {(p.get("NCCL_PROTO"), p.get("speculative_algorithm")) for _, _, p in scored} == {
        (proto, algo) for proto in (None, "LL", "LL128", "Simple") for algo in (None, "EAGLE3")
    }
    kept = [v for v, corrupt, _ in scored if not corrupt]
    assert 0 < len(kept) < len(scored)  # the demo's space holds both kinds
    assert all(p.get("NCCL_PROTO") == "LL128" for _, corrupt, p in scored if corrupt)  # only the forced LL128 points
    # and every forced-LL128 point is refused: NCCL carries decode and verify on this PCIe host whatever the
    # space's backend value (config/commplan: both all_reduce_backend values put them on NCCL)
    assert all(corrupt for _, corrupt, p in scored if p.get("NCCL_PROTO") == "LL128")
