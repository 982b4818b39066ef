"""SGLang 0.5.23's all-reduce resolution (config/allreduce.py), pinned against its source as read from the
wheel (`pip download --no-deps sglang==0.5.23`); each case names the file and function whose rule it pins.
Read in code only: none of these rules was run on a GPU here."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import experiment as spec_mod
from orchestrator.config.allreduce import (
    Backend,
    CommContext,
    Host,
    ModelFacts,
    backend_flags,
    carried,
    nccl_matters,
    resolve_path,
)
from orchestrator.config.eagle import Rule, infeasible
from orchestrator.trial import plan as planner

KIMI = ModelFacts("KimiK25ForConditionalGeneration", 7168)
LLAMA = ModelFacts("LlamaForCausalLM", 8192)
H200 = Host("h200", "NVIDIA H200", (9, 0), "nvlink", 8, nvlink_multicast=True, default_cuda_graph_max_bs=512)
B200_2N = Host("b200", "NVIDIA B200", (10, 0), "nvlink", 8, nodes=2, nvlink_multicast=True)
H200_2N = Host("h200x2n", "NVIDIA H200", (9, 0), "nvlink", 8, nodes=2)
RTX = Host("rtx", "NVIDIA RTX PRO 6000", (12, 0), "pcie", 8)
RTX_NO_IPC = Host("rtx-old-flashinfer", "NVIDIA RTX PRO 6000", (12, 0), "pcie", 8, flashinfer_pcie_ipc=False)


def decode(path) -> Backend:
    return path.carrier(1)


CASES = [
    # (name, model, host, tp, flags, env, decode backend, tokens -> backend checks)
    (
        "overrides.py _flashinfer_allreduce_fusion_auto_enable: Kimi-K2.5 on SM90, one node, TP 8",
        KIMI,
        H200,
        8,
        {},
        {},
        Backend.flashinfer_fusion,
        {2048: Backend.flashinfer_fusion, 2049: Backend.nccl},
    ),
    (
        "--disable-custom-all-reduce does not turn the fusion off (only _enforce_disable_allreduce_fusion does)",
        KIMI,
        H200,
        8,
        {"--disable-custom-all-reduce": True},
        {},
        Backend.flashinfer_fusion,
        {4096: Backend.nccl},
    ),
    (
        "overrides.py _enforce_disable_allreduce_fusion: custom all-reduce V2 carries up to 16 MiB "
        "(environ.py SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB)",
        KIMI,
        H200,
        8,
        {"--enforce-disable-flashinfer-allreduce-fusion": True},
        {},
        Backend.custom,
        {1170: Backend.custom, 1171: Backend.nccl},
    ),
    (
        "an architecture outside _FLASHINFER_ALLREDUCE_FUSION_ARCHS keeps custom all-reduce",
        LLAMA,
        H200,
        8,
        {},
        {},
        Backend.custom,
        {},
    ),
    ("auto-enable needs nnodes == 1 unless SM100", KIMI, H200_2N, 8, {}, {}, Backend.nccl, {}),
    (
        "auto-enable on SM100 across nodes (is_sm100 or nnodes == 1)",
        KIMI,
        B200_2N,
        8,
        {},
        {},
        Backend.flashinfer_fusion,
        {},
    ),
    (
        "auto-enable needs no attention DP (attn_dp_enabled_of)",
        KIMI,
        H200,
        8,
        {"enable-dp-attention": True},
        {},
        Backend.custom,
        {},
    ),
    ("auto-enable needs --moe-a2a-backend none", KIMI, H200, 8, {"moe-a2a-backend": "deepep"}, {}, Backend.custom, {}),
    (
        "SM120 is neither is_sm90 nor is_sm100: no fusion; custom_all_reduce_utils.py "
        "can_use_custom_all_reduce_with_nvlink refuses more than two PCIe-only GPUs: NCCL",
        KIMI,
        RTX,
        8,
        {},
        {},
        Backend.nccl,
        {},
    ),
    (
        "pcie_ipc_ar.py eligible_group + _resolve_outplace_all_reduce_method: PCIe-IPC up to the decode width "
        "(cuda-graph max bs 160 x 1 token)",
        KIMI,
        RTX,
        8,
        {},
        {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"},
        Backend.pcie_ipc,
        {160: Backend.pcie_ipc, 161: Backend.nccl},
    ),
    (
        "pcie_ipc_ar.py _ensure_workspace: SGLANG_PCIE_IPC_MAX_NUMEL overrides the width",
        KIMI,
        RTX,
        8,
        {},
        {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1", "SGLANG_PCIE_IPC_MAX_NUMEL": str(7168 * 1000)},
        Backend.pcie_ipc,
        {1000: Backend.pcie_ipc, 1001: Backend.nccl},
    ),
    (
        "pcie_ipc_ar.py _SUPPORTED_WORLD_SIZES (2, 4, 8): TP 6 stays on NCCL",
        KIMI,
        RTX,
        6,
        {},
        {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"},
        Backend.nccl,
        {},
    ),
    (
        "pcie_ipc_ar.py eligible_group: deterministic inference leaves PCIe-IPC off",
        KIMI,
        RTX,
        8,
        {"enable-deterministic-inference": True},
        {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"},
        Backend.nccl,
        {},
    ),
    (
        "PcieIpcCommunicator.__init__: no pcie_ipc_comm in the FlashInfer build falls back to NCCL",
        KIMI,
        RTX_NO_IPC,
        8,
        {},
        {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"},
        Backend.nccl,
        {},
    ),
    (
        "torch_symm_mem.py TorchSymmMemCommunicator: SM90 TP 8 up to 128 MiB (behind custom all-reduce in "
        "_resolve_outplace_all_reduce_method, so the knob turns custom off)",
        KIMI,
        H200,
        8,
        {
            "--enable-torch-symm-mem": True,
            "--disable-custom-all-reduce": True,
            "--enforce-disable-flashinfer-allreduce-fusion": True,
        },
        {},
        Backend.torch_symm_mem,
        {9362: Backend.torch_symm_mem, 9363: Backend.nccl},
    ),
    ("TP 1: GroupCoordinator.all_reduce returns the input (no all-reduce)", KIMI, H200, 1, {}, {}, Backend.nccl, {}),
]


@pytest.mark.parametrize(
    ("model", "host", "tp", "flags", "env", "want", "sizes"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_resolution_follows_sglang_0_5_23(model, host, tp, flags, env, want, sizes):
    path = resolve_path(model, host, tp, flags, env)
    if tp == 1:
        assert path.bands == ()
        return
    assert decode(path) is want
    for tokens, backend in sizes.items():
        assert path.carrier(tokens) is backend, tokens


def test_the_auto_enable_line_is_sglangs_own():
    """overrides.py: logger.info("Auto-enabling FlashInfer AllReduce Fusion (%s) for %s", backend, model_arch)."""
    path = resolve_path(KIMI, H200, 8, {}, {})
    assert "Auto-enabling FlashInfer AllReduce Fusion (auto) for KimiK25ForConditionalGeneration" in path.log_lines


def test_pcie_ipc_workspace_grows_with_draft_tokens():
    """pcie_ipc_ar.py _decode_width / base_runner.py _widest_decode_rows: max_bs x draft tokens per request."""
    path = resolve_path(
        KIMI, RTX, 8, {"--cuda-graph-max-bs-decode": "48"}, {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}, draft_tokens=4
    )
    assert path.carrier(192) is Backend.pcie_ipc and path.carrier(193) is Backend.nccl
    eager = resolve_path(
        KIMI, RTX, 8, {"--cuda-graph-backend-decode": "disabled"}, {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    )
    assert eager.carrier(64) is Backend.pcie_ipc and eager.carrier(65) is Backend.nccl  # _FALLBACK_DECODE_WIDTH


RENDER = [
    ("auto", {}, {}),
    ("nccl", {"--disable-custom-all-reduce": True, "--enforce-disable-flashinfer-allreduce-fusion": True}, {}),
    ("custom", {"--enforce-disable-flashinfer-allreduce-fusion": True}, {}),
    ("flashinfer_fusion", {"--flashinfer-allreduce-fusion-backend": "auto"}, {}),
    (
        "pcie_ipc",
        {"--disable-custom-all-reduce": True, "--enforce-disable-flashinfer-allreduce-fusion": True},
        {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"},
    ),
    (
        "torch_symm_mem",
        {
            "--enable-torch-symm-mem": True,
            "--disable-custom-all-reduce": True,
            "--enforce-disable-flashinfer-allreduce-fusion": True,
        },
        {},
    ),
    ("mscclpp", {"--enable-mscclpp": True, "--enforce-disable-flashinfer-allreduce-fusion": True}, {}),
]


@pytest.mark.parametrize(("backend", "flags", "env"), RENDER, ids=[r[0] for r in RENDER])
def test_each_backend_renders_to_0_5_23_flags_and_env(backend, flags, env):
    assert backend_flags(backend) == (flags, env)


@pytest.mark.parametrize(
    ("backend", "host"),
    [
        ("nccl", H200),
        ("custom", H200),
        ("flashinfer_fusion", H200),
        ("torch_symm_mem", H200),
        ("mscclpp", H200),
        ("nccl", RTX),
        ("pcie_ipc", RTX),
    ],
)
def test_a_feasible_backend_carries_decode_when_asked(backend, host):
    """Each backend the host takes really carries one-token all-reduces with the flags it renders to."""
    path = CommContext(KIMI, host, 8).path({"all_reduce_backend": backend})
    assert decode(path) is Backend(backend)
    if backend == "nccl":
        assert path.enabled == {Backend.nccl}


REFUSED = [
    (
        "flashinfer_fusion",
        RTX,
        "--flashinfer-allreduce-fusion-backend requires SM90 or SM10X NVIDIA GPUs, this host is SM12x",
    ),
    ("custom", RTX, "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs"),
    ("torch_symm_mem", RTX, "TorchSymmMemCommunicator: Device capability 12 not supported"),
    ("mscclpp", RTX, "this tool models MSCCL++ on NVLink hosts only"),
]


@pytest.mark.parametrize(("backend", "host", "reason"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_backend_the_host_cannot_take_is_infeasible_before_launch(backend, host, reason):
    why = infeasible({"all_reduce_backend": backend}, CommContext(KIMI, host, 8))
    assert why is not None and why.rule is Rule.backend_unavailable
    assert reason in why.detail


def test_mscclpp_world_sizes_and_pcie_ipc_runtime_fallback_is_not_a_launch_rule():
    """pymscclpp.py _SUPPORTED_WORLD_SIZES (4, 8, ...): TP 2 refused; a FlashInfer build without
    pcie_ipc_comm is only seen at run time (the trial's env_not_applied, not a free refusal)."""
    assert infeasible({"all_reduce_backend": "mscclpp"}, CommContext(KIMI, H200, 2)) is not None
    assert infeasible({"all_reduce_backend": "pcie_ipc"}, CommContext(KIMI, RTX_NO_IPC, 8)) is None
    assert infeasible({"all_reduce_backend": "pcie_ipc"}) is None  # no host known: nothing to refuse


def test_nccl_matters_only_where_nccl_carries_an_objective_class():
    fused = resolve_path(KIMI, H200, 8, {}, {})
    classes = [
        carried(fused, "decode", 1, 48),
        carried(fused, "verify", 2, 48 * 16),
        carried(fused, "prefill", 8192, 8192),
    ]
    assert not nccl_matters(classes, ["decode", "verify"])
    assert nccl_matters(classes, ["prefill"])
    pcie = resolve_path(KIMI, RTX, 8, {}, {})
    assert nccl_matters([carried(pcie, "decode", 1, 1)], ["decode"])


def test_the_launch_plan_carries_the_backends_flags_and_env():
    s = spec_mod.load(Path(__file__).resolve().parents[2] / "experiments" / "kimi-k2.5-tp8.yaml")
    lp = planner.make(s, {"all_reduce_backend": "pcie_ipc"}, port=30000)
    assert lp.env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    assert lp.flags["--disable-custom-all-reduce"] is True
    assert "--enforce-disable-flashinfer-allreduce-fusion" in lp.argv
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in planner.make(s, {"all_reduce_backend": "auto"}, port=30000).env


def test_the_serving_config_a_deployment_exports_carries_the_backend():
    """What `sweep export` writes (every format renders the serving config's env and sglang_args)."""
    s = spec_mod.load(Path(__file__).resolve().parents[2] / "experiments" / "kimi-k2.5-tp8.yaml")
    sc = planner.serving_config(
        s, {"all_reduce_backend": "pcie_ipc"}, trial_number=1, run_id="r", metrics={}, fingerprint_hash=""
    )
    assert sc.env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    assert "--disable-custom-all-reduce" in sc.sglang_args
    assert "--enforce-disable-flashinfer-allreduce-fusion" in sc.sglang_args
    fused = planner.serving_config(
        s, {"all_reduce_backend": "flashinfer_fusion"}, trial_number=1, run_id="r", metrics={}, fingerprint_hash=""
    )
    assert fused.sglang_args[fused.sglang_args.index("--flashinfer-allreduce-fusion-backend") + 1] == "auto"
