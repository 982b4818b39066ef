"""The host as a trial saw it: GPUs (nvidia-smi), CUDA, topology, the NCCL version its ranks loaded, the
versions the server's interpreter imports, CPU and host name; and the stable part of it that tells one setup
from another (fingerprint_hash, fingerprint_diff). The shells run nvidia-smi and the interpreter and never
raise; parse_gpu_query and the hash are pure."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.nccllog import parse_nccl_log

__all__ = [
    "STABLE_FIELDS",
    "fingerprint",
    "fingerprint_diff",
    "fingerprint_hash",
    "interpreter_versions",
    "parse_gpu_query",
]

Run = Callable[..., subprocess.CompletedProcess]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

_GPU_FIELDS = (
    ("index", "index"),
    ("name", "name"),
    ("uuid", "uuid"),
    ("pci.bus_id", "pci_bus_id"),
    ("driver_version", "driver"),
    ("memory.total", "memory_total_mib"),
    ("clocks.sm", "sm_clock_mhz"),
    ("clocks.mem", "mem_clock_mhz"),
    ("clocks.max.sm", "sm_clock_max_mhz"),
    ("clocks.max.mem", "mem_clock_max_mhz"),
    ("power.draw", "power_w"),
    ("power.limit", "power_limit_w"),
    ("temperature.gpu", "temperature_c"),
    ("pcie.link.gen.current", "pcie_gen"),
    ("pcie.link.gen.max", "pcie_gen_max"),
    ("pcie.link.width.current", "pcie_width"),
    ("pcie.link.width.max", "pcie_width_max"),
)
_OPTIONAL_GPU_FIELDS = (("clocks_event_reasons.active", "clock_event_reasons"),)
_TEXT_FIELDS = frozenset({"name", "uuid", "pci_bus_id", "driver", "clock_event_reasons"})

STABLE_FIELDS = (
    "host",
    "gpu_count",
    "gpu_names",
    "driver",
    "cuda",
    "nccl",
    "torch",
    "sglang",
    "pcie_gen_max",
    "pcie_width_max",
    "topology",
    "simulated",
)
"""The fingerprint fields that identify the setup; clocks, power and temperature are left out so a
warm GPU does not look like another machine."""


def _call(run: Run, argv: list[str], timeout: float = 15.0) -> tuple[str | None, str | None]:
    """(stdout, None) on success, (None, why) otherwise; never raises."""
    try:
        proc = run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return None, "absent"
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:g} s"
    except Exception as exc:  # a fingerprint must never fail a trial
        return None, f"{type(exc).__name__}: {exc}"
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout or "").strip().splitlines()
        return None, f"exit {proc.returncode}: {err[-1] if err else ''}".strip()
    return proc.stdout or "", None


def _value(key: str, text: str) -> Any:
    text = text.strip()
    if text in ("", "[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]"):
        return None
    if key in _TEXT_FIELDS:
        return text
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() else number


def parse_gpu_query(text: str, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` as dicts."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(keys):
            continue
        gpus.append({k: _value(k, c) for k, c in zip(keys, cells)})
    return gpus


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


_PACKAGES = {
    "torch": ("torch",),
    "sglang": ("sglang",),
    "sgl_kernel": ("sgl-kernel", "sglang-kernel"),
    "nccl_package": ("nvidia-nccl-cu13", "nvidia-nccl-cu12"),
}
"""Fingerprint field -> the distributions whose version it records (the first one installed)."""

# Run by the server's interpreter: the versions it imports, not the sweep's own (the two differ when
# server.python names another venv). Standard library only, one JSON line.
_VERSIONS_SCRIPT = (
    "import importlib.metadata as m, json, platform\n"
    "def v(*names):\n"
    "    for n in names:\n"
    "        try:\n"
    "            return m.version(n)\n"
    "        except m.PackageNotFoundError:\n"
    "            pass\n"
    "packages = json.loads(%r)\n"
    "print(json.dumps({'python': platform.python_version(), **{k: v(*n) for k, n in packages.items()}}))\n"
)


def interpreter_versions(python: str, *, run: Run = subprocess.run) -> tuple[dict[str, Any], str | None]:
    """(python, torch, sglang, sgl_kernel and nccl_package versions as `python` sees them, None) or
    ({}, why) when that interpreter could not be asked. Never raises."""
    out, why = _call(run, [python, "-I", "-c", _VERSIONS_SCRIPT % json.dumps(_PACKAGES)], timeout=60.0)
    if out is None:
        return {}, why
    try:
        found = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}, f"unreadable answer: {out.strip()[:200]!r}"
    if not isinstance(found, dict):
        return {}, f"unreadable answer: {out.strip()[:200]!r}"
    return {k: found.get(k) for k in ("python", *_PACKAGES)}, None


def _server_versions(fp: dict[str, Any], python: str, run: Run) -> None:
    """The Python, torch and SGLang versions `python` imports, over the sweep's own in `fp` (or why not)."""
    fp["server_python"] = python
    found, why = interpreter_versions(python, run=run)
    if why is None:
        fp.update(found)
    else:
        fp.update({k: None for k in _PACKAGES})
        fp["versions_error"] = why


def _query_gpus(run: Run) -> tuple[str | None, str | None, list[str]]:
    """(nvidia-smi's CSV rows or None, why not, the keys of its columns): with the optional fields first,
    then without them for a driver that lacks them."""
    keys = [k for _, k in _GPU_FIELDS]
    query = [q for q, _ in _GPU_FIELDS]
    out, why = None, None
    for extra in (_OPTIONAL_GPU_FIELDS, ()):
        q = query + [e for e, _ in extra]
        out, why = _call(run, ["nvidia-smi", f"--query-gpu={','.join(q)}", "--format=csv,noheader,nounits"])
        if out is not None or why == "absent":
            keys = keys + [k for _, k in extra]
            break
    return out, why, keys


def _gpu_fields(run: Run) -> dict[str, Any]:
    """The GPUs, driver, CUDA version and topology as nvidia-smi tells them (gpu_count 0 without it)."""
    out, why, keys = _query_gpus(run)
    if out is None:
        return {"gpu_count": 0, "nvidia_smi": why if why == "absent" else f"failed: {why}"}
    gpus = parse_gpu_query(out, keys)
    found: dict[str, Any] = {
        "nvidia_smi": "ok",
        "gpu_count": len(gpus),
        "gpu_names": [g.get("name") for g in gpus],
        "driver": gpus[0].get("driver") if gpus else None,
        "pcie_gen_max": [g.get("pcie_gen_max") for g in gpus],
        "pcie_width_max": [g.get("pcie_width_max") for g in gpus],
        "gpus": gpus,
    }
    header, _ = _call(run, ["nvidia-smi"])
    m = re.search(r"CUDA Version:\s*([\d.]+)", header or "")
    found["cuda"] = m.group(1) if m else None
    topo, topo_why = _call(run, ["nvidia-smi", "topo", "-m"])
    found["topology"] = _ANSI.sub("", topo).strip() if topo is not None else None
    if topo is None:
        found["topology_error"] = topo_why
    return found


def fingerprint(
    *,
    run: Run = subprocess.run,
    nccl_log: str | None = None,
    simulated: Mapping[str, Any] | None = None,
    python: str | None = None,
) -> dict[str, Any]:
    """The host as a trial saw it: GPUs (names, driver, clocks, power, temperature, PCIe link),
    CUDA, topology, NCCL version loaded (from `nccl_log`, NCCL_DEBUG=INFO lines, else None), torch
    and SGLang versions, Python, CPU, host name. Works without nvidia-smi and never raises.
    `python` is the server's interpreter: the Python, torch and SGLang versions are the ones it
    imports (`server_python` names it; `versions_error` says why when it could not be asked).
    `simulated` (the simulator's fake hardware) is merged in and marked with 'simulated': True."""
    fp: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        **{k: _dist_version(*names) for k, names in _PACKAGES.items()},
        "nccl": None,
    }
    if python is not None:
        _server_versions(fp, python, run)
    if nccl_log:
        versions = sorted({i.version for i in parse_nccl_log(nccl_log).values() if i.version})
        fp["nccl"] = ", ".join(versions) or None
    fp.update(_gpu_fields(run))
    if simulated:
        fp.update(dict(simulated))
        fp["simulated"] = True
    return fp


def _stable(fp: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key in STABLE_FIELDS:
        value = fp.get(key)
        if key == "topology" and isinstance(value, str):
            value = " ".join(_ANSI.sub("", value).split())
        out[key] = value
    return out


def fingerprint_hash(fp: Mapping[str, Any]) -> str:
    """A short hash of the stable fields (STABLE_FIELDS): equal setups hash equal whatever the
    clocks, power or temperature were."""
    blob = json.dumps(_stable(fp), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def fingerprint_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What changed between two fingerprints, one line per stable field (empty iff the hashes match)."""
    sa, sb = _stable(a), _stable(b)
    lines = []
    for key in STABLE_FIELDS:
        if sa[key] != sb[key]:
            if key == "topology":
                lines.append("topology: the GPU interconnect matrix changed")
            else:
                lines.append(f"{key}: {sa[key]!r} -> {sb[key]!r}")
    return lines
