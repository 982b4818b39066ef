"""The simulator's all-reduce backends: the same resolution as the orchestrator's (config/allreduce.py,
SGLang 0.5.23 as read from its wheel), SGLang's own lines, and each backend's timing per message size on
each hardware profile, against the published figures the profiles cite."""

from __future__ import annotations

import pytest

from orchestrator.config import allreduce as ar
from orchestrator.simulator import load_hardware, load_model
from orchestrator.simulator.model import (
    FUSION_ARCHS,
    NcclSettings,
    carried_all_reduce,
    evaluate,
    resolve,
)

KIMI = load_model("kimi-k2.5")
PROFILES = ("h200-nvlink", "h200-nvlink-x8", "pcie-rtxpro6000-x8", "pcie-rtxpro6000-x8-turin")
BACKENDS = ("auto", "nccl", "custom", "flashinfer_fusion", "pcie_ipc", "torch_symm_mem", "mscclpp")


def host_of(name: str) -> ar.Host:
    hw = load_hardware(name)
    return ar.Host(
        name,
        hw.gpu_name,
        hw.compute_capability,
        "nvlink" if hw.interconnect == "nvlink" else "pcie",
        hw.gpus,
        nodes=hw.nodes,
        nvlink_multicast=hw.nvlink_multicast,
        flashinfer_pcie_ipc=hw.pcie_ipc is not None,
        default_cuda_graph_max_bs=hw.default_cuda_graph_max_bs,
    )


def test_the_fusion_architectures_are_one_list():
    assert FUSION_ARCHS == ar.FUSION_ARCHS


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_simulator_and_orchestrator_resolve_alike(profile, backend):
    """Every backend on every profile: the simulator's decode/verify/prefill carrier is the orchestrator's
    prediction (what `sweep plan` prints), unless the profile has no timing for a backend SGLang would build
    (then the simulator cannot run it, and the rules refuse it before launch)."""
    hw = load_hardware(profile)
    tp = hw.gpus
    model = ar.ModelFacts(KIMI.architectures[0], KIMI.hidden_size, KIMI.dtype_bytes)
    ctx = ar.CommContext(model, host_of(profile), tp)
    if ctx.refusal({"all_reduce_backend": backend}) is not None:
        return
    params = {
        "all_reduce_backend": backend,
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
    }
    cfg = resolve(params, hw, KIMI)
    assert not isinstance(cfg, str)
    path = ctx.path(params, draft_tokens=4)
    token = KIMI.hidden_size * KIMI.dtype_bytes
    for tokens in (1, 4, 48 * 4, 161, 2048, 2049, 8192):
        sim = carried_all_reduce(hw, NcclSettings(), cfg.comm, tp, tokens, token, tokens <= 512)
        assert sim.path == path.carrier(tokens).value, (tokens, sim.path)


def test_pcie_ipc_is_timed_as_its_docstring_measured():
    """pcie_ipc_ar.py docstring, 8x SM120, hidden 6144 bf16: 12 KiB 5.3 us, 96 KiB 15.3 us, 384 KiB 34.6 us."""
    hw = load_hardware("pcie-rtxpro6000-x8")
    assert hw.pcie_ipc is not None
    for nbytes, us in ((12288, 5.3), (98304, 15.3), (393216, 34.6)):
        assert hw.pcie_ipc.us(nbytes, hw.launch_us_graph) == pytest.approx(us)


def test_pcie_ipc_speeds_up_decode_on_the_pcie_host_and_nccl_keeps_prefill():
    hw = load_hardware("pcie-rtxpro6000-x8")
    nccl = evaluate({}, hw, KIMI)
    ipc = evaluate({"all_reduce_backend": "pcie_ipc"}, hw, KIMI)
    assert (nccl.ar_path, ipc.ar_path) == ("nccl", "pcie_ipc")
    assert ipc.decode_tok_s > nccl.decode_tok_s
    cfg = resolve({"all_reduce_backend": "pcie_ipc"}, hw, KIMI)
    assert not isinstance(cfg, str)
    assert carried_all_reduce(hw, NcclSettings(), cfg.comm, 8, 512, 14336, False).path == "nccl"  # a 512-token prompt


def test_the_sglang_lines_the_simulator_writes():
    """Verbatim 0.5.23 log formats: overrides.py, flashinfer_comm_fusion.py, pcie_ipc_ar.py."""
    h200 = resolve({}, load_hardware("h200-nvlink-x8"), KIMI)
    pcie = resolve({"all_reduce_backend": "pcie_ipc"}, load_hardware("pcie-rtxpro6000-x8"), KIMI)
    assert not isinstance(h200, str) and not isinstance(pcie, str)
    texts = [t for _, _, t in h200.comm.lines]
    assert texts[0] == "Auto-enabling FlashInfer AllReduce Fusion (auto) for KimiK25ForConditionalGeneration"
    assert (
        "FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm, rank=0, world_size=8, "
        "max_token_num=2048, hidden_dim=7168"
    ) in texts
    texts = [t for _, _, t in pcie.comm.lines]
    assert "FlashInfer PCIe-IPC all-reduce enabled (world=8, workspace sized on first reduction)" in texts
    assert "FlashInfer PCIe-IPC workspace built (world=8, max_numel=1146880, hidden=7168)" in texts  # 160 x 7168


def test_nccl_max_ctas_is_nccl_max_nchannels_and_the_more_restrictive_wins():
    """NCCL 2.28+ names NCCL_MAX_CTAS / NCCL_MIN_CTAS for the deprecated *_NCHANNELS; both set: the more
    restrictive (smaller maximum, larger minimum) wins."""
    hw = load_hardware("pcie-rtxpro6000-x8")
    old, new = evaluate({"NCCL_MAX_NCHANNELS": "2"}, hw, KIMI), evaluate({"NCCL_MAX_CTAS": "2"}, hw, KIMI)
    assert old.decode_tok_s == new.decode_tok_s and old.nccl_channels == new.nccl_channels
    both = evaluate({"NCCL_MAX_NCHANNELS": "16", "NCCL_MAX_CTAS": "2"}, hw, KIMI)
    assert both.nccl_channels == old.nccl_channels
    assert NcclSettings.from_env({"NCCL_MIN_NCHANNELS": "4", "NCCL_MIN_CTAS": "8"}).min_channels == 8
