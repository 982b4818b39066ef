"""The probe's keep rule applied to the all-reduce backend (sweep/_probe_stage.fixed_backend), on a real
simulated probe and a real Optuna sqlite study: where the probe measured the path the space's other backend
value puts decode and verify on (NCCL) more than probe.keep_within x slower than the engine default's,
fresh proposals keep the engine default and the refinement never flips to it; where both values put the
messages on the same path (a PCIe host: NCCL either way) nothing is fixed.

Which backend carries each message class per value is SGLang 0.5.23's resolution as config/allreduce.py
reads it (sglang/srt/arg_groups/overrides.py `_flashinfer_allreduce_fusion_auto_enable`,
layers/layer_boundary/residual/add_norm.py `flashinfer_ar_fusion_applies`, distributed/parallel_state.py
`GroupCoordinator.all_reduce`): on an h200-nvlink-x8 host the engine default sends decode and verify
through flashinfer's fused all-reduce, `all_reduce_backend nccl` (--disable-custom-all-reduce,
--enforce-disable-flashinfer-allreduce-fusion) through NCCL. Only code was read; nothing here ran on a GPU:
the latencies are the simulated probe's (the reference's H200 measurements)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probe"))
from probe_helpers import write_spec  # noqa: E402

from orchestrator.probe import comm, run_probe  # noqa: E402
from orchestrator.search import space as sp  # noqa: E402
from orchestrator.search.refine import Refinement  # noqa: E402
from orchestrator.search.study import Study  # noqa: E402
from orchestrator.sweep._probe_stage import apply_probe, fixed_backend  # noqa: E402

H200 = "h200-nvlink-x8"


def _spec(tmp_path: Path, profile: str, **sections):
    spec = write_spec(
        tmp_path, simulator={"hardware_profile": profile}, probe={"enabled": True, "keep_within": 1.2}, **sections
    )
    inert = comm.collapsed(spec).nccl  # as the driver opens its study: NCCL knobs only where NCCL carries
    if inert is not None:
        spec = spec.model_copy(update={"space": sp.collapse_inert(spec.space, inert.knobs, inert.when)})
    return spec


def _study(tmp_path: Path, spec) -> Study:
    study = Study(f"sqlite:///{tmp_path / 'optuna.db'}", spec.name, spec.space, spec.sampler, ["maximize"])
    study.open()
    return study


def test_on_h200_the_probe_keeps_the_engine_defaults_backend_and_fresh_proposals_take_it(tmp_path: Path) -> None:
    spec = _spec(tmp_path, H200)
    result = run_probe(spec, tmp_path / "wd", budget=24)
    fixed = fixed_backend(spec, result)
    assert fixed is not None
    values, line = fixed
    assert values == {"all_reduce_backend": None}
    assert "flashinfer_fusion" in line and "all_reduce_backend nccl: decode on nccl" in line
    study = _study(tmp_path, spec)
    assert apply_probe(study, spec, result)["fixed"] == {"all_reduce_backend": None}  # the stage's line names it
    assert study.fixed == {"all_reduce_backend": None}
    # a study that offers nccl at random (sampler start) never proposes it now: 40 fresh proposals
    asked = [study.ask() for _ in range(40)]
    fresh = [a for a in asked if a is not None and "role" not in a[2]]
    assert len(fresh) >= 30
    assert all(a[1]["all_reduce_backend"] is None for a in fresh)
    assert all(a[1].get(k) is None for a in fresh for k in a[1] if k.startswith("NCCL_"))  # inert there
    # an enqueued point keeps what it was enqueued with (a re-measure of an older nccl trial)
    study.enqueue({**sp.baseline_params(spec.space), "all_reduce_backend": "nccl"}, {"role": "search", "again": 1})
    again = next(a for a in (study.ask() for _ in range(5)) if a is not None and a[2].get("again"))
    assert again[1]["all_reduce_backend"] == "nccl"
    # resumed: a new Study on the same storage reads the fixed value back
    assert _study(tmp_path, spec).fixed == {"all_reduce_backend": None}


def test_the_refinement_never_flips_a_fixed_knob(tmp_path: Path) -> None:
    spec = _spec(tmp_path, H200)
    point = sp.complete(
        spec.space,
        {
            "speculative_algorithm": "EAGLE3",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 2,
            "speculative_num_draft_tokens": 6,
        },
    )
    free = Refinement(spec.space, {}, {}).neighbours(point)
    held = Refinement(spec.space, {}, {}, {"all_reduce_backend": None}).neighbours(point)
    assert any(p["all_reduce_backend"] == "nccl" for p in free)
    assert held == [p for p in free if p["all_reduce_backend"] is None]


def test_where_both_values_put_the_messages_on_nccl_nothing_is_fixed(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "pcie-rtxpro6000-x8")
    result = run_probe(spec, tmp_path / "wd", budget=24)
    assert fixed_backend(spec, result) is None
    study = _study(tmp_path, spec)
    assert "fixed" not in apply_probe(study, spec, result)
    assert study.fixed == {}


def test_an_objective_that_depends_on_prefill_is_left_alone(tmp_path: Path) -> None:
    # output_tok_s at 32 streams depends on prefill too, which the engine default splits between
    # flashinfer_fusion (up to 2048 tokens here) and NCCL: the probe's decode and verify sizes do not decide it
    spec = _spec(
        tmp_path,
        H200,
        objective={"metric": "output_tok_s", "concurrency": 32},
        benchmark={"concurrency": 32, "requests": 32},
    )
    result = run_probe(spec, tmp_path / "wd", budget=24)
    assert fixed_backend(spec, result) is None
