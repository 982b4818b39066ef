"""Which all-reduce carried the decode/verify messages, as SGLang's own log lines prove it, and the
warnings a plan deserves when NCCL variables would not do what the sweep assumes (reference INTERFACE.md
2.1-2.2). SGLang 0.5.23's resolution itself is config/allreduce.py's (re-exported here). Pure: flags, log
text and a hardware description in, words out."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from orchestrator.config.allreduce import (
    BACKEND_CHOICES,
    CUSTOM_AR_WORLD_SIZES,
    FUSE_ALLREDUCE_MAX_BATCH_SIZE,
    OBJECTIVE_CLASSES,
    Backend,
    Band,
    Carried,
    CommPath,
    Host,
    ModelFacts,
    Refusal,
    backend_flags,
    backend_refusal,
    carried,
    nccl_matters,
    resolve_path,
)
from orchestrator.config.allreduce import flag_on as _on
from orchestrator.config.allreduce import normalize_flags as _flags
from orchestrator.nccllog import tuner_masked

__all__ = [
    "BACKEND_CHOICES",
    "CUSTOM_AR_WORLD_SIZES",
    "FUSE_ALLREDUCE_MAX_BATCH_SIZE",
    "OBJECTIVE_CLASSES",
    "Backend",
    "Band",
    "Carried",
    "CommPath",
    "Host",
    "ModelFacts",
    "Refusal",
    "allreduce_path",
    "backend_flags",
    "backend_refusal",
    "carried",
    "check_backend_applied",
    "decode_backend_in_log",
    "nccl_matters",
    "plan_warnings",
    "refused_in_log",
    "resolve_path",
]


def _tp_size(flags: Mapping[str, Any]) -> int | None:
    for key in ("tp_size", "tensor_parallel_size", "tp"):
        if key in flags:
            try:
                return int(flags[key])
            except (TypeError, ValueError):
                return None
    return None


def _link(hardware: str | None) -> str | None:
    """'nvlink', 'pcie' or None from a hardware description (a profile name such as
    'h200-nvlink', free text) or an `nvidia-smi topo -m` matrix."""
    text = hardware or ""
    if "GPU0" in text:  # a topology matrix: judge the GPU-to-GPU cells, not the legend
        matrix = text.split("Legend:")[0]
        if re.search(r"\bNV\d+\b", matrix):
            return "nvlink"
        if re.search(r"\b(PIX|PXB|PHB|NODE|SYS)\b", matrix):
            return "pcie"
        return None
    text = text.lower()
    if any(w in text for w in ("nvlink", "nvswitch", "sxm", "nvl")):
        return "nvlink"
    if "pcie" in text:
        return "pcie"
    return None


_AR_NCCL = re.compile(
    r"(?i)call path: NCCL|custom AR disabled|custom ?all-?reduce(?:V2)? (?:is )?disabled|"
    r"setup custom all-?reduce failed|custom all-?reduce.*not supported"
)
_AR_CUSTOM = re.compile(r"(?i)\[AR\].*custom\s*all-?reduce")


def allreduce_path(flags: Mapping[str, Any], log_text: str, hardware: str | None) -> str:
    """Which implementation carried the decode all-reduces: 'flashinfer_fusion', 'pcie_ipc', 'custom'
    (SGLang's kernel), 'nccl', 'none' (TP 1: there are none) or 'unknown'.

    The server log decides when it says so: 0.5.23's 'FlashInfer AllReduce Fusion enabled and workspace
    initialized' or 'FlashInfer PCIe-IPC ... enabled/workspace built' without a fallback line after it
    (decode_backend_in_log), else SGLang's `[AR] ...` lines, 'Custom allreduce ... disabled/failed'
    warnings (the last such line wins). Otherwise the flags and hardware:
    `hardware` is a description ('h200-nvlink', '8x RTX PRO 6000 PCIe') or the fingerprint's
    `nvidia-smi topo -m` matrix.
    --disable-custom-all-reduce or --enable-deterministic-inference -> nccl; custom all-reduce
    needs one node with NVLink and a world size of 2, 4, 6 or 8, so PCIe with more than 2 GPUs,
    or another TP size, -> nccl; NVLink with a supported size -> custom.
    """
    f = _flags(flags)
    tp = _tp_size(f)
    if tp == 1:
        return "none"
    proven = decode_backend_in_log(log_text)
    if proven in (Backend.flashinfer_fusion.value, Backend.pcie_ipc.value):
        return proven
    verdict = None
    for line in (log_text or "").splitlines():
        if _AR_NCCL.search(line):
            verdict = "nccl"
        elif _AR_CUSTOM.search(line):
            verdict = "custom"
    if verdict:
        return verdict
    if _on(f, "disable_custom_all_reduce") or _on(f, "enable_deterministic_inference"):
        return "nccl"
    link = _link(hardware)
    if tp is None or link is None:
        return "unknown"
    if tp not in CUSTOM_AR_WORLD_SIZES:
        return "nccl"
    if link == "pcie":
        return "nccl" if tp > 2 else "unknown"
    return "custom"


_NCCL_NOT_TUNING = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"})


def _custom_path_warning(nccl: Sequence[str]) -> str:
    return (
        f"{', '.join(nccl)} {'is' if len(nccl) == 1 else 'are'} swept, but on this NVLink host "
        f"SGLang's custom all-reduce carries every all-reduce up to 16 MB, which includes all "
        f"decode and verify all-reduces, and where SGLang 0.5.23 auto-enables the FlashInfer all-reduce "
        f"fusion (SM90/SM100 GPUs, a fusion architecture such as KimiK25ForConditionalGeneration) the fusion "
        f"carries decode and verify up to 2048 tokens before it: NCCL_* are inert for decode and verify "
        f"either way (--disable-custom-all-reduce leaves the fusion on); NCCL only sees larger prefill "
        f"all-reduces and all-gathers. Sweep all_reduce_backend nccl (custom all-reduce and the fusion off) "
        f"to put NCCL on the verify path; `sweep plan --host <profile>` shows which backend carries each "
        f"message class."
    )


def _forced_by_flags(env: Mapping[str, str], f: Mapping[str, Any]) -> list[str]:
    """What --enable-symm-mem and --enable-nccl-nvls force over the plan's environment."""
    if _on(f, "enable_symm_mem"):
        forced = [n for n in ("NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE") if n in env and env[n] != "1"]
        return [
            "--enable-symm-mem forces NCCL_CUMEM_ENABLE=1 and NCCL_NVLS_ENABLE=1 in the server"
            + (f", overwriting the plan's {', '.join(f'{n}={env[n]}' for n in forced)}" if forced else "")
            + "; NVLink multicast (NVLS) must stay off on shared hosts."
        ]
    if _on(f, "enable_nccl_nvls") and env.get("NCCL_NVLS_ENABLE", "1") != "1":
        return [
            f"--enable-nccl-nvls forces NCCL_NVLS_ENABLE=1, overwriting the plan's "
            f"NCCL_NVLS_ENABLE={env['NCCL_NVLS_ENABLE']}."
        ]
    return []


def _set_by_sglang(names: Sequence[str], f: Mapping[str, Any]) -> list[str]:
    """The swept variables SGLang sets itself when they are unset (so a trial without one is not NCCL's default)."""
    symm = _on(f, "enable_symm_mem")
    found = []
    if "NCCL_CUMEM_ENABLE" in names and not symm:
        found.append(
            "NCCL_CUMEM_ENABLE: SGLang sets it to 0 itself when it is unset, so a trial without it "
            "runs with 0 (not NCCL's default), and --enable-symm-mem would overwrite it with 1."
        )
    if "NCCL_NVLS_ENABLE" in names and not symm and not _on(f, "enable_nccl_nvls"):
        found.append(
            "NCCL_NVLS_ENABLE: SGLang sets it to 0 itself when it is unset, and --enable-nccl-nvls "
            "or --enable-symm-mem overwrite it with 1."
        )
    if "NCCL_GRAPH_REGISTER" in names:
        found.append(
            "NCCL_GRAPH_REGISTER: SGLang sets it to 0 itself when unset whenever CUDA graphs capture "
            "collectives with TP > 1, so a trial without it does not run NCCL's default."
        )
    return found


def _deterministic_warning(names: Sequence[str], f: Mapping[str, Any]) -> list[str]:
    hit = [n for n in ("NCCL_ALGO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS") if n in names]
    if not hit or not _on(f, "enable_deterministic_inference"):
        return []
    return [
        f"--enable-deterministic-inference overwrites {', '.join(hit)} (NCCL_ALGO=allreduce:tree, "
        f"NCCL_MIN_NCHANNELS=NCCL_MAX_NCHANNELS=8) and disables custom all-reduce: sweeping "
        f"{'it' if len(hit) == 1 else 'them'} measures nothing."
    ]


def plan_warnings(
    env: Mapping[str, str],
    flags: Mapping[str, Any],
    hardware: str | None,
    *,
    swept: Iterable[str] | None = None,
    path_known: bool = False,
) -> list[str]:
    """Warnings for `sweep plan` about NCCL variables that will not do what the sweep assumes.

    `env` is what a plan sets, `swept` the variable names the search varies (default: every
    NCCL_* in env). `path_known`: the caller resolved the path per message class itself (config/commplan),
    so the custom-all-reduce warning, which cannot see the FlashInfer fusion, is left out. See INTERFACE.md 2.1-2.2.
    """
    f = _flags(flags)
    names = sorted(set(swept) if swept is not None else set(env))
    nccl = [n for n in names if n.startswith("NCCL_") and n not in _NCCL_NOT_TUNING]
    warnings = []
    if nccl and not path_known and allreduce_path(f, "", hardware) == "custom":
        warnings.append(_custom_path_warning(nccl))
    warnings += _forced_by_flags(env, f)
    warnings += _set_by_sglang(names, f)
    warnings += _deterministic_warning(names, f)
    if masked := tuner_masked({**env, **{n: env.get(n, "") for n in names}}):
        warnings.append(masked + ".")
    return warnings


# ---------------------------------------------------------------------------------------------
# What SGLang's log says ran

_FUSION_ON = re.compile(r"FlashInfer AllReduce Fusion enabled and workspace initialized: .*max_token_num=(\d+)")
_FUSION_OFF = re.compile(
    r"(FlashInfer allreduce fusion is forcibly disabled.*|Failed to initialize FlashInfer workspace.*|"
    r"FlashInfer workspace preflight: cuMemCreate probe failed.*|FlashInfer AllReduce fusion disabled:.*|"
    r"flashinfer\.comm (?:unified )?allreduce_fusion API is not available.*|"
    r"FlashInfer comm not available, skipping workspace initialization)"
)
_PCIE_ON = re.compile(r"FlashInfer PCIe-IPC (?:all-reduce enabled|workspace built) \(world=\d+(?:, max_numel=(\d+))?")
_PCIE_OFF = re.compile(
    r"(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has no pcie_ipc_comm.*|"
    r"Deterministic inference is on; leaving PCIe-IPC all-reduce off.*|"
    r"FlashInfer PCIe-IPC all-reduce serves bf16 only.*|FlashInfer PCIe-IPC workspace \(max_numel=\d+\) failed.*|"
    r"Setup FlashInfer PCIe-IPC allreduce failed.*|FlashInfer PCIe-IPC all-reduce skipped.*)"
)
_CUSTOM_ON = re.compile(
    r"All Reduce config: symmetric_memory = |\[AR\] Using CustomAllReduceV2|\[AR\].*custom\s*all-?reduce"
)
_TSM_OFF = re.compile(r"(TorchSymmMemCommunicator: .*not (?:supported|available).*)")
_MSCCLPP_OFF = re.compile(r"(PyMscclpp is (?:disabled|unavailable).*)")
_OFF = {
    Backend.flashinfer_fusion: _FUSION_OFF,
    Backend.pcie_ipc: _PCIE_OFF,
    Backend.torch_symm_mem: _TSM_OFF,
    Backend.mscclpp: _MSCCLPP_OFF,
}


def _message(line: str) -> str:
    """A log line without SGLang's `[time TPn]` prefix and level word."""
    line = re.sub(r"^\[[^\]]*\]\s*", "", line.strip())
    return re.sub(r"^(?:WARNING|INFO|ERROR)\s*:?\s*", "", line)


def refused_in_log(backend: str, log_text: str) -> str | None:
    """SGLang's own sentence that it turned `backend` off or fell back from it, or None."""
    try:
        want = Backend(backend)
    except ValueError:
        return None
    pattern = _OFF.get(want)
    if want is Backend.custom:
        pattern = _AR_NCCL
    if pattern is None:
        return None
    for line in (log_text or "").splitlines():
        if m := pattern.search(line):
            return _message(line[m.start() :] if want is not Backend.custom else line)
    return None


def decode_backend_in_log(log_text: str) -> str | None:
    """The backend SGLang's start-up lines prove for one-token (decode) all-reduces, in 0.5.23's order:
    the fusion's workspace, then custom all-reduce, then PCIe-IPC; None when the log does not say."""
    text = log_text or ""
    fused = bool(_FUSION_ON.search(text)) and not _FUSION_OFF.search(text)
    if fused:
        return Backend.flashinfer_fusion.value
    lines = text.splitlines()
    if any(_CUSTOM_ON.search(line) for line in lines) and not any(_AR_NCCL.search(line) for line in lines):
        return Backend.custom.value
    if _PCIE_ON.search(text) and not _PCIE_OFF.search(text):
        return Backend.pcie_ipc.value
    return None


def check_backend_applied(requested: str | None, log_text: str) -> tuple[bool, str]:
    """(ok, reason) for a trial that asked for all-reduce backend `requested`: not ok (env_not_applied)
    when SGLang's log says it refused or fell back from it (its sentence is the reason), or, for the
    FlashInfer backends, when its start-up line that the backend is on never came."""
    if requested in (None, "auto", "nccl"):
        return True, ""
    why = refused_in_log(str(requested), log_text)
    if why:
        return False, f"all_reduce_backend {requested} not applied: SGLang fell back to NCCL: {why}"
    proof = {"flashinfer_fusion": _FUSION_ON, "pcie_ipc": _PCIE_ON}.get(str(requested))
    if proof is not None and not proof.search(log_text or ""):
        return False, (
            f"all_reduce_backend {requested} not applied: SGLang never logged that it is on "
            f"({'FlashInfer AllReduce Fusion enabled' if requested == 'flashinfer_fusion' else 'FlashInfer PCIe-IPC all-reduce enabled'} ...)"
        )
    return True, f"SGLang's log shows {requested} on"
