"""Which all-reduce carries the decode/verify messages (SGLang's custom kernel or NCCL), and the warnings a
plan deserves when NCCL variables would not do what the sweep assumes (reference INTERFACE.md 2.1-2.2).
Pure: flags, log text and a hardware description in, words out."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.nccllog import tuner_masked


def _flag_key(name: str) -> str:
    return name.lstrip("-").replace("-", "_").lower()


def _flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    return {_flag_key(k): v for k, v in flags.items()}


def _on(flags: Mapping[str, Any], name: str) -> bool:
    value = flags.get(name, False)
    if isinstance(value, str):
        return value.strip().lower() in ("", "1", "true", "yes", "on")
    return bool(value)


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
    r"(?i)call path: NCCL|custom AR disabled|custom all-?reduce (?:is )?disabled|"
    r"setup custom all-?reduce failed|custom all-?reduce.*not supported")
_AR_CUSTOM = re.compile(r"(?i)\[AR\].*custom\s*all-?reduce")

CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)


def allreduce_path(flags: Mapping[str, Any], log_text: str, hardware: str | None) -> str:
    """Which implementation carried the decode/verify all-reduces: 'custom' (SGLang's kernel),
    'nccl', 'none' (TP 1: there are none) or 'unknown'.

    The server log decides when it says so (SGLang's `[AR] ...` lines, 'Custom allreduce ...
    disabled/failed' warnings; the last such line wins). Otherwise the flags and hardware:
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


def plan_warnings(
    env: Mapping[str, str],
    flags: Mapping[str, Any],
    hardware: str | None,
    *,
    swept: Iterable[str] | None = None,
) -> list[str]:
    """Warnings for `sweep plan` about NCCL variables that will not do what the sweep assumes.

    `env` is what a plan sets, `swept` the variable names the search varies (default: every
    NCCL_* in env). See INTERFACE.md 2.1-2.2.
    """
    f = _flags(flags)
    names = sorted(set(swept) if swept is not None else set(env))
    nccl = [n for n in names if n.startswith("NCCL_") and n not in _NCCL_NOT_TUNING]
    warnings = []
    if nccl and allreduce_path(f, "", hardware) == "custom":
        warnings.append(
            f"{', '.join(nccl)} {'is' if len(nccl) == 1 else 'are'} swept, but on this NVLink host "
            f"SGLang's custom all-reduce carries every all-reduce up to 16 MB, which includes all "
            f"decode and verify all-reduces; NCCL only sees larger prefill all-reduces and "
            f"all-gathers, so these variables will barely change verify latency. Add "
            f"--disable-custom-all-reduce to the plan (or sweep it) to put NCCL on the verify path.")
    symm = _on(f, "enable_symm_mem")
    if symm:
        forced = [n for n in ("NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE") if n in env and env[n] != "1"]
        warnings.append(
            "--enable-symm-mem forces NCCL_CUMEM_ENABLE=1 and NCCL_NVLS_ENABLE=1 in the server"
            + (f", overwriting the plan's {', '.join(f'{n}={env[n]}' for n in forced)}" if forced else "")
            + "; NVLink multicast (NVLS) must stay off on shared hosts.")
    if _on(f, "enable_nccl_nvls") and not symm and env.get("NCCL_NVLS_ENABLE", "1") != "1":
        warnings.append(f"--enable-nccl-nvls forces NCCL_NVLS_ENABLE=1, overwriting the plan's "
                        f"NCCL_NVLS_ENABLE={env['NCCL_NVLS_ENABLE']}.")
    if "NCCL_CUMEM_ENABLE" in names and not symm:
        warnings.append(
            "NCCL_CUMEM_ENABLE: SGLang sets it to 0 itself when it is unset, so a trial without it "
            "runs with 0 (not NCCL's default), and --enable-symm-mem would overwrite it with 1.")
    if "NCCL_NVLS_ENABLE" in names and not symm and not _on(f, "enable_nccl_nvls"):
        warnings.append(
            "NCCL_NVLS_ENABLE: SGLang sets it to 0 itself when it is unset, and --enable-nccl-nvls "
            "or --enable-symm-mem overwrite it with 1.")
    if "NCCL_GRAPH_REGISTER" in names:
        warnings.append(
            "NCCL_GRAPH_REGISTER: SGLang sets it to 0 itself when unset whenever CUDA graphs capture "
            "collectives with TP > 1, so a trial without it does not run NCCL's default.")
    if _on(f, "enable_deterministic_inference"):
        hit = [n for n in ("NCCL_ALGO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS") if n in names]
        if hit:
            warnings.append(
                f"--enable-deterministic-inference overwrites {', '.join(hit)} (NCCL_ALGO=allreduce:tree, "
                f"NCCL_MIN_NCHANNELS=NCCL_MAX_NCHANNELS=8) and disables custom all-reduce: sweeping "
                f"{'it' if len(hit) == 1 else 'them'} measures nothing.")
    if masked := tuner_masked({**env, **{n: env.get(n, "") for n in names}}):
        warnings.append(masked + ".")
    return warnings
