"""`sweep plan experiments/kimi-k2.5-tp8.yaml --host ...`: the backend per message class and the inert NCCL
knobs on an H200 host, an 8x RTX PRO 6000 PCIe host and the Turin host, pinned against SGLang 0.5.23's rules
as read from its wheel (never run on a GPU here):

- sglang/srt/arg_groups/overrides.py `_flashinfer_allreduce_fusion_auto_enable`: KimiK25ForConditionalGeneration
  on SM90, TP 8, one node -> flashinfer_allreduce_fusion_backend=auto; `--disable-custom-all-reduce`
  (the deprecated all_reduce_path nccl) leaves it on, `_enforce_disable_allreduce_fusion`
  (all_reduce_backend nccl) turns it off.
- sglang/srt/layers/layer_boundary/residual/add_norm.py `flashinfer_ar_fusion_applies`: up to
  FUSE_ALLREDUCE_MAX_BATCH_SIZE = 2048 tokens; larger prefill chunks go on (custom's 16 MiB is 1170 tokens
  of Kimi's 7168-wide bf16 rows, so NCCL).
- sglang/srt/distributed/device_communicators/custom_all_reduce_utils.py
  `can_use_custom_all_reduce_with_nvlink`: no custom all-reduce on more than two PCIe-only GPUs; SM120 is not
  SM90/SM100, so no fusion: NCCL carries everything on the PCIe hosts.
- sglang/srt/distributed/device_communicators/pcie_ipc_ar.py `eligible_group` / `_decode_width`: PCIe-IPC
  with SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1, up to max captured batch (48 with speculation) x draft tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.cli.check import comm_context
from orchestrator.config import commplan
from orchestrator.config import experiment as spec_mod
from orchestrator.config.allreduce import Backend
from orchestrator.probe import comm
from orchestrator.search import space as sp

KIMI = Path(__file__).resolve().parents[2] / "experiments" / "kimi-k2.5-tp8.yaml"
NCCL_KNOBS = "NCCL_PROTO, NCCL_ALGO, NCCL_MAX_CTAS, NCCL_BUFFSIZE, NCCL_NTHREADS, NCCL_P2P_LEVEL"


def plan_text(host: str) -> str:
    result = CliRunner().invoke(app, ["plan", str(KIMI), "--host", host, "--limit", "0"], terminal_width=400)
    assert result.exit_code == 0, result.output
    return result.output


def test_h200_fusion_carries_decode_and_verify_and_the_nccl_knobs_are_inert():
    text = plan_text("h200-nvlink-x8")
    assert "on 8x NVIDIA H200 (NVLink, SM90), KimiK25ForConditionalGeneration, tp 8:" in text
    assert "    decode: flashinfer_fusion (1-32 tokens, 14 KiB-448 KiB)" in text
    assert "    verify: flashinfer_fusion (2-512 tokens, 28 KiB-7.0 MiB)" in text
    assert (
        "    prefill: flashinfer_fusion (512-2048 tokens, 7.0 MiB-28.0 MiB), nccl (2049-8192 tokens, "
        "28.0 MiB-112.0 MiB)"
    ) in text
    # all_reduce_backend nccl (search_spaces/eagle3.yaml) turns the fusion off: NCCL carries decode and verify
    after_nccl = text.split("  all_reduce_backend nccl:")[1]
    assert after_nccl.lstrip().startswith("decode: nccl (1-32 tokens")
    assert (
        text.count("-> flashinfer_fusion carries decode and verify up to 2048 tokens: NCCL_* affect prefill only") == 1
    )
    assert f"{NCCL_KNOBS} matter only at all_reduce_backend nccl: searched only there" in text
    assert "collapsed search space: 445953 distinct combinations, 383727 feasible" in text
    assert "custom all-reduce carries every all-reduce up to 16 MB" not in text  # the old warning, blind to fusion


@pytest.mark.parametrize("host", ["pcie-rtxpro6000-x8", "pcie-rtxpro6000-x8-turin"])
def test_pcie_hosts_nccl_carries_everything_and_pcie_ipc_is_offered(host):
    text = plan_text(host)
    assert "(PCIe, SM120)" in text
    assert "    decode: nccl (1-32 tokens, 14 KiB-448 KiB)" in text
    assert "    verify: nccl (2-512 tokens, 28 KiB-7.0 MiB)" in text
    assert "-> NCCL carries decode and verify: the NCCL_* knobs matter" in text
    assert (
        "    pcie_ipc: decode: pcie_ipc (1-32 tokens, 14 KiB-448 KiB); verify: pcie_ipc (2-512 tokens, 28 KiB-7.0 MiB)"
    ) in text
    assert "inert for" not in text
    # both values of the space's all_reduce_backend leave decode and verify on NCCL here: the knob is dropped
    assert (
        "all_reduce_backend (engine default, nccl) puts decode, verify on the same carriers on "
        f"{host} (decode: nccl (1-32 tokens, 14 KiB-448 KiB); verify: nccl (2-512 tokens, 28 KiB-7.0 MiB)), "
        "so all_reduce_backend is not searched"
    ) in text
    assert "collapsed search space: 445824 distinct combinations, 383616 feasible" in text  # half of 891648
    for refused in ("flashinfer_fusion:", "torch_symm_mem:", "custom:"):  # SM120 / PCIe: not offered
        assert f"    {refused}" not in text


def test_deprecated_names_warn_in_the_plan(tmp_path: Path):
    """NCCL 2.28+ documents NCCL_MAX_NCHANNELS / NCCL_MIN_NCHANNELS as deprecated for NCCL_MAX_CTAS /
    NCCL_MIN_CTAS: search_spaces/nccl.yaml uses the new name, an old space still loads, with a warning."""
    text = plan_text("h200-nvlink-x8")
    assert "is deprecated" not in text  # nccl.yaml uses NCCL_MAX_CTAS, eagle3.yaml all_reduce_backend
    old = tmp_path / "old.yaml"
    old.write_text(
        KIMI.read_text(encoding="utf-8").replace(
            "  - ../search_spaces/nccl.yaml\n", f"  - {tmp_path / 'nccl-old.yaml'}\n"
        ),
        encoding="utf-8",
    )
    nccl = (KIMI.parents[1] / "search_spaces" / "nccl.yaml").read_text(encoding="utf-8")
    (tmp_path / "nccl-old.yaml").write_text(
        nccl.replace("NCCL_MAX_CTAS:     ", "NCCL_MAX_NCHANNELS:"), encoding="utf-8"
    )
    (tmp_path / "speculation.yaml").write_text(
        (KIMI.parents[1] / "search_spaces" / "speculation.yaml").read_text(), encoding="utf-8"
    )
    old.write_text(
        old.read_text(encoding="utf-8").replace(
            "../search_spaces/speculation.yaml", str(tmp_path / "speculation.yaml")
        ),
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, ["plan", str(old), "--host", "h200-nvlink-x8", "--limit", "0"], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert (
        "warning: NCCL_MAX_NCHANNELS is deprecated since NCCL 2.28 in favour of NCCL_MAX_CTAS (when both are "
        "set the more restrictive wins); it still works"
    ) in result.output


def test_nccl_knobs_are_searched_only_where_nccl_carries_the_objective():
    """A space offering all_reduce_backend [auto, nccl] on H200: the NCCL knobs stay only under nccl."""
    s = spec_mod.load(KIMI)
    space = s.space.model_copy(
        update={
            "params": {
                **{k: v for k, v in s.space.params.items() if k != "all_reduce_path"},
                "all_reduce_backend": sp.ParamSpec(choices=("auto", "nccl")),
            }
        }
    )
    s = s.model_copy(update={"space": space})
    ctx = comm_context(s, "h200-nvlink-x8", None)
    assert ctx is not None
    cp = commplan.plan(s, ctx)
    assert [a.nccl_matters for a in cp.arms] == [False, True]
    when = commplan.collapse_values(cp)
    assert when == {"all_reduce_backend": ("nccl",)}
    collapsed = sp.collapse_inert(space, cp.nccl_knobs, when)
    assert collapsed.params["NCCL_PROTO"].when == {"all_reduce_backend": ["nccl"]}
    assert sp.census(collapsed)[0] < sp.census(space)[0]
    point = sp.complete(collapsed, {"all_reduce_backend": "auto"})
    assert point["NCCL_PROTO"] is None  # inactive where fusion carries decode/verify


def test_a_backend_the_host_cannot_take_is_counted_infeasible_in_the_plan():
    s = spec_mod.load(KIMI)
    space = s.space.model_copy(
        update={"params": {"all_reduce_backend": sp.ParamSpec(choices=("auto", "flashinfer_fusion", "pcie_ipc"))}}
    )
    s = s.model_copy(update={"space": space})
    pcie = comm_context(s, "pcie-rtxpro6000-x8", None)
    total, feasible, reasons = sp.census(space, pcie)
    assert (total, feasible) == (3, 2)
    assert list(reasons) == ["all_reduce_backend this host or model cannot take (SGLang 0.5.23)"]
    assert commplan.plan(s, pcie).arms[2].classes[0].backends[0][0] is Backend.pcie_ipc


def test_the_backend_knob_is_kept_where_a_value_moves_a_message_or_the_space_names_it():
    spec = spec_mod.load(KIMI)
    h200 = comm_context(spec, "h200-nvlink-x8", None)
    assert commplan.inert_backend(commplan.plan(spec, h200)) is None  # nccl moves decode/verify off the fusion
    pcie = comm_context(spec, "pcie-rtxpro6000-x8", None)
    assert commplan.inert_backend(commplan.plan(spec, pcie)) == "all_reduce_backend"
    assert comm.collapsed(spec, pcie).backend is not None
    # a knob whose `when` names the backend keeps it: dropping it would orphan that condition
    params = dict(spec.space.params)
    params["NCCL_PROTO"] = params["NCCL_PROTO"].model_copy(update={"when": {"all_reduce_backend": ["nccl"]}})
    named = spec.model_copy(update={"space": spec.space.model_copy(update={"params": params})})
    assert comm.collapsed(named, pcie).backend is None
