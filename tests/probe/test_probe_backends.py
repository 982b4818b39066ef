"""The probe measures each all-reduce backend the host offers at the NCCL settings' sizes and ranks them
together (issue 19). On this machine (no GPU) two paths run: the simulated probe (the hardware profile's
model of each backend, as SGLang 0.5.23 resolves all_reduce_backend there: config/allreduce.py, read from
its code) and a GPU host's skip with the reason (SGLang's communicators do not import in this venv). The
GPU measurement through SGLang's communicators is not written and has never run on a GPU."""

from __future__ import annotations

import pytest
from probe_helpers import write_spec

from orchestrator.probe import backends, rank_settings, rank_with_backends, read_probe, run_probe, with_backends
from orchestrator.probe.comm import comm_context


@pytest.mark.parametrize(
    "profile,offered",
    [
        ("h200-nvlink-x8", ("custom", "flashinfer_fusion", "torch_symm_mem", "mscclpp")),
        ("h200-nvlink", ("custom", "flashinfer_fusion")),
        ("pcie-rtxpro6000-x8", ("pcie_ipc",)),
    ],
)
def test_the_host_offers_the_backends_0_5_23_would_run_there(tmp_path, profile, offered):
    spec = write_spec(
        tmp_path, simulator={"hardware_profile": profile}, server={"tp": 2} if profile == "h200-nvlink" else {}
    )
    assert backends.offered(comm_context(spec, None, None)) == offered


def test_simulated_probe_ranks_backends_beside_the_nccl_settings(tmp_path):
    spec = write_spec(tmp_path)  # pcie-rtxpro6000-x8: NCCL carries everything unless PCIe-IPC is asked for
    result = run_probe(spec, tmp_path / "wd", budget=6)
    assert [(b.backend, b.status) for b in result.backends] == [("pcie_ipc", "ok")]
    sizes = {s.label for s in result.sizes}
    rows = {(r.size, r.mode): r for r in result.backend_rows}
    assert {size for size, _ in rows} == sizes and {mode for _, mode in rows} == {"graph", "eager"}
    assert rows[("decode", "graph")].backend == "pcie_ipc"
    assert rows[("large-32MiB", "graph")].backend == "nccl"  # past the decode-sized workspace: NCCL's
    assert read_probe(tmp_path / "wd" / "probe.json") == result  # written with the NCCL settings
    ranked = rank_with_backends(result, keep_within=1.1)
    assert len(ranked) == len(result.settings) + 1
    assert ranked[0].setting == "all_reduce_backend=pcie_ipc" and ranked[0].kept and ranked[0].relative == 1.0
    nccl_best = next(r for r in ranked if not r.setting.startswith("all_reduce_backend="))
    assert nccl_best.relative is not None and nccl_best.relative > 1.0  # the simulated PCIe-IPC is faster
    # the driver's stage restricts NCCL knobs from rank_settings, which holds NCCL settings only
    assert all(not r.setting.startswith("all_reduce_backend=") for r in rank_settings(result, keep_within=1.1))


def test_a_gpu_host_skips_each_backend_with_the_reason(tmp_path):
    """engine sglang on a host the experiment describes (h200-nvlink-x8): no GPU measures here, and SGLang's
    communicators do not import in this venv, so each offered backend is skipped, saying which module."""
    (tmp_path / "sim").mkdir()
    nccl_only = run_probe(write_spec(tmp_path / "sim"), tmp_path / "sim-wd", budget=2)
    spec = write_spec(tmp_path, engine="sglang", simulator={"hardware_profile": "h200-nvlink-x8"})
    result = with_backends(nccl_only.model_copy(update={"backends": (), "backend_rows": ()}), spec, tmp_path)
    assert [b.backend for b in result.backends] == ["custom", "flashinfer_fusion", "torch_symm_mem", "mscclpp"]
    assert all(b.status == "skipped" for b in result.backends) and result.backend_rows == ()
    custom = result.backends[0]
    assert custom.reason.startswith(
        "sglang.srt.distributed.device_communicators.custom_all_reduce does not import in the probe's environment"
    )
    assert "pip install -e '.[sglang,probe]'" in custom.reason
    assert read_probe(tmp_path / "probe.json").backends == result.backends
    assert [r.setting for r in rank_with_backends(result)] == [r.setting for r in rank_settings(result)]


def test_without_a_described_host_nothing_is_offered(tmp_path):
    spec = write_spec(tmp_path, engine="sglang")
    assert backends.offered(comm_context(spec, None, None)) == ()
