"""Proof per trial, from SGLang's own log lines (here the simulator's, which writes SGLang 0.5.23's lines
verbatim), of which all-reduce backend carried the decode messages; an asked-for backend SGLang fell back
from fails the trial as env_not_applied with SGLang's own sentence. Real simulator servers, no mocks.

The 0.5.23 sources of the lines: pcie_ipc_ar.py PcieIpcCommunicator.__init__ ("... this FlashInfer build has
no pcie_ipc_comm; falling back to NCCL all-reduce."), flashinfer_comm_fusion.py
FlashInferWorkspaceManager.initialize ("FlashInfer AllReduce Fusion enabled and workspace initialized: ..."),
arg_groups/overrides.py _flashinfer_allreduce_fusion_auto_enable ("Auto-enabling FlashInfer AllReduce Fusion
(auto) for <arch>"). Never run on a GPU here: the lines are as read in the code."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from orchestrator.config import experiment as spec_mod
from orchestrator.config.experiment import SweepSpec
from orchestrator.records import FailureKind, TrialSpec, TrialStatus
from orchestrator.search import space as sp
from orchestrator.tracking.convert import outcome_tags
from orchestrator.trial.runner import run_trial

DEMO = Path(__file__).resolve().parents[2] / "experiments" / "demo.yaml"
FALLBACK = (
    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has no pcie_ipc_comm; "
    "falling back to NCCL all-reduce."
)


def demo_on(hardware_profile: str, tp: int = 8) -> SweepSpec:
    s = spec_mod.load(DEMO)
    return s.model_copy(
        update={
            "server": s.server.model_copy(update={"tp": tp}),
            "simulator": s.simulator.model_copy(update={"hardware_profile": hardware_profile}),
            "benchmark": s.benchmark.model_copy(update={"requests": 2, "output_len": 16}),
        }
    )


def trial(s: SweepSpec, params: dict, folder: Path, tp: int = 8):
    spec = TrialSpec(number=1, params={**sp.baseline_params(s.space), **params}, trial_dir=str(folder), experiment=s)
    return run_trial(spec, gpu_ids=[str(i) for i in range(tp)], node="n1")


def old_flashinfer_host(tmp_path: Path) -> str:
    """The PCIe host of the field report with a FlashInfer build that lacks pcie_ipc_comm."""
    path = resources.files("orchestrator.simulator").joinpath("profiles/pcie-rtxpro6000-x8.yaml")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data.update(name="pcie-rtxpro6000-x8-old-flashinfer", pcie_ipc=None)
    out = tmp_path / "pcie-old-flashinfer.yaml"
    out.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(out)


def test_pcie_ipc_that_sglang_falls_back_from_is_env_not_applied_with_its_reason(tmp_path: Path) -> None:
    s = demo_on(old_flashinfer_host(tmp_path))
    outcome = trial(s, {"all_reduce_backend": "pcie_ipc"}, tmp_path / "t")
    assert outcome.status is TrialStatus.FAILED, (outcome.reason, outcome.log_tail)
    assert outcome.failure_kind is FailureKind.env_not_applied
    assert outcome.reason == f"all_reduce_backend pcie_ipc not applied: SGLang fell back to NCCL: {FALLBACK}"
    assert outcome.allreduce_path == "nccl"


def test_pcie_ipc_where_it_runs_is_the_decode_path(tmp_path: Path) -> None:
    outcome = trial(demo_on("pcie-rtxpro6000-x8"), {"all_reduce_backend": "pcie_ipc"}, tmp_path / "t")
    assert outcome.status is TrialStatus.COMPLETE, (outcome.reason, outcome.log_tail)
    assert outcome.allreduce_path == "pcie_ipc"
    assert outcome.launch is not None and outcome.launch.env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    log = (tmp_path / "t" / "server.log").read_text()
    assert "FlashInfer PCIe-IPC all-reduce enabled (world=8, workspace sized on first reduction)" in log


def test_a_trial_on_the_h200_profile_records_flashinfer_fusion_as_the_decode_path(tmp_path: Path) -> None:
    s = demo_on("h200-nvlink", tp=2)
    outcome = trial(s, {}, tmp_path / "t", tp=2)
    assert outcome.status is TrialStatus.COMPLETE, (outcome.reason, outcome.log_tail)
    assert outcome.allreduce_path == "flashinfer_fusion"
    assert outcome_tags(outcome)["sweep.allreduce_path"] == "flashinfer_fusion"  # the trial's MLflow row
    log = (tmp_path / "t" / "server.log").read_text()
    assert "Auto-enabling FlashInfer AllReduce Fusion (auto) for KimiK25ForConditionalGeneration" in log
    # all_reduce_path nccl (--disable-custom-all-reduce) does not move decode off the fusion in 0.5.23 ...
    legacy = trial(s, {"all_reduce_path": "nccl"}, tmp_path / "legacy", tp=2)
    assert legacy.allreduce_path == "flashinfer_fusion", legacy.log_tail
    # ... all_reduce_backend nccl does
    nccl = trial(s, {"all_reduce_backend": "nccl"}, tmp_path / "nccl", tp=2)
    assert nccl.status is TrialStatus.COMPLETE and nccl.allreduce_path == "nccl"
