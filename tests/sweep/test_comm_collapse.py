"""The sweep searches NCCL knobs only where NCCL carries what the objective depends on (issues 19, 20).
On the H200 profile SGLang 0.5.23 auto-enables FlashInfer's all-reduce fusion for Kimi-K2.5 (read in
sglang/srt/arg_groups/overrides.py, _flashinfer_allreduce_fusion_auto_enable: SM90, TP > 1, one node),
and the fused all-reduce carries decode and verify up to FUSE_ALLREDUCE_MAX_BATCH_SIZE tokens, so the
NCCL knobs touch nothing a one-stream decode objective measures unless the trial forces the NCCL
backend: the driver (search/space.collapse_all) keeps them only under all_reduce_backend nccl. On the PCIe profile NCCL carries decode and verify
and the knobs are searched, while all_reduce_backend, whose two values both leave them on NCCL there,
is not. Read from SGLang's code; no GPU was used."""

from __future__ import annotations

import json

from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def launched_params(wd) -> list[dict]:  # type: ignore[no-untyped-def]
    return [json.loads(p.read_text())["params"] for p in sorted((wd / "trials").glob("*/outcome.json"))]


def run(tmp_path, template, profile: str):  # type: ignore[no-untyped-def]
    data = demo_experiment(
        name=profile.replace("-", ""),
        simulator={"hardware_profile": profile},
        budget={"trials": 8, "concurrent_trials": 2},
        promotion={"max_rounds": 0},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data, name=f"{profile}.yaml"))
    wd = tmp_path / profile
    copy_store(template, wd)
    Sweep(spec, wd, executor=ModelExecutor(2)).run()
    return wd


def test_on_the_h200_profile_nccl_knobs_are_searched_only_where_nccl_carries(tmp_path, sqlite_store_template):
    # Since 4a79cf9 the NCCL knobs stay in the space under all_reduce_backend nccl (the one backend that
    # routes decode and verify through NCCL on this profile), and only there.
    wd = run(tmp_path, sqlite_store_template, "h200-nvlink-x8")
    trials = launched_params(wd)
    assert len(trials) == 8
    tuned = [t for t in trials if any(v is not None for k, v in t.items() if k.startswith("NCCL_"))]
    assert all(t["all_reduce_backend"] == "nccl" for t in tuned), tuned
    assert any(t["all_reduce_backend"] != "nccl" for t in trials[1:])  # the auto path was searched too
    log = (wd / "sweep.log").read_text()
    assert (
        "communication path: NCCL carries decode, verify on h200-nvlink-x8 only with all_reduce_backend in ['nccl']"
    ) in log and "are searched only there" in log


def test_on_the_pcie_profile_the_nccl_knobs_are_searched_and_the_backend_knob_is_not(tmp_path, sqlite_store_template):
    # On the PCIe profile both values of all_reduce_backend (engine default, nccl) leave decode and verify on
    # NCCL (no custom all-reduce on more than two PCIe GPUs: custom_all_reduce_utils.py
    # can_use_custom_all_reduce_with_nvlink; no fusion on SM120: overrides.py
    # _flashinfer_allreduce_fusion_auto_enable), so the knob is dropped and every trial launches the default.
    wd = run(tmp_path, sqlite_store_template, "pcie-rtxpro6000-x8")
    trials = launched_params(wd)
    assert len(trials) == 8
    assert any(v is not None for t in trials for k, v in t.items() if k.startswith("NCCL_"))
    assert all(t.get("all_reduce_backend") is None for t in trials), trials
    log = (wd / "sweep.log").read_text()
    assert "NCCL carries" not in log  # the NCCL knobs are not collapsed
    assert (
        "communication path: all_reduce_backend (engine default, nccl) puts decode, verify on the same "
        "carriers on pcie-rtxpro6000-x8"
    ) in log and "so all_reduce_backend is not searched" in log
