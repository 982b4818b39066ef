"""What really ran: the environment each rank worker got, NCCL's own account of its settings, which
all-reduce carried the decode/verify messages, and the host's fingerprint.

Thin shells read the process tree (procs) and run nvidia-smi; everything they read goes through pure functions
(evaluate_env, check_env_applied, fingerprint_hash; nccllog's parse_nccl_log; allreduce.py's allreduce_path and
plan_warnings) that the tests drive with text in the real formats.

/proc/<pid>/environ shows the environment a process was exec'ed with. SGLang starts its scheduler
processes with multiprocessing's spawn method (a fresh exec that inherits the launcher's
environment, including the NCCL_* variables SGLang sets itself before spawning), so it shows what
NCCL in each rank reads. A process that forks without exec and then changes its environment is
not seen correctly; NCCL's `... set by environment to ...` lines (NCCL_DEBUG=INFO) are the
independent cross-check.
"""

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
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from orchestrator.nccllog import NOT_ECHOED, DeviceLog, env_problems, parse_nccl_log, tuner_problems
from orchestrator.records import Frozen
from orchestrator.redact import redact_env, redact_text
from orchestrator.trial import procs
from orchestrator.trial.allreduce import allreduce_path, check_backend_applied, plan_warnings

__all__ = [
    "RANK_WORKER_RULE",
    "STABLE_FIELDS",
    "EnvObservation",
    "NcclRankInfo",
    "ProcessEnv",
    "ProcessSnapshot",
    "allreduce_path",
    "check_backend_applied",
    "check_env_applied",
    "evaluate_env",
    "fingerprint",
    "fingerprint_diff",
    "fingerprint_hash",
    "observe_env",
    "parse_gpu_query",
    "parse_nccl_log",
    "plan_warnings",
    "rank_from_cmdline",
    "rank_workers",
    "snapshot_tree",
]
"""allreduce_path, check_backend_applied and plan_warnings are allreduce.py's, re-exported: the observation
reports the path and fails a trial whose asked-for all-reduce backend SGLang refused or fell back from;
parse_nccl_log is nccllog.py's (NCCL's line formats are documented there)."""


# ---------------------------------------------------------------------------------------------
# The server's process tree


@dataclass(frozen=True)
class ProcessSnapshot:
    """One process as /proc showed it at one moment."""

    pid: int
    ppid: int | None
    cmdline: tuple[str, ...]
    exe: str | None
    environ: dict[str, str] | None
    """None when /proc/<pid>/environ could not be read."""
    nice: int | None = None
    """Its nice value when read (None: not read)."""


def snapshot_tree(server_pid: int) -> list[ProcessSnapshot]:
    """The server process and all its descendants, read now."""
    snaps = []
    for pid in [server_pid, *procs.descendants(server_pid)]:
        cmdline = procs.cmdline(pid)
        if cmdline is None and not procs.alive(pid):
            continue  # exited between listing and reading
        snaps.append(
            ProcessSnapshot(
                pid=pid,
                ppid=procs.parent(pid),
                cmdline=cmdline or (),
                exe=procs.exe(pid),
                environ=procs.environ(pid),
                nice=procs.niceness(pid),
            )
        )
    return snaps


# ---------------------------------------------------------------------------------------------
# Which processes are rank workers, and what they got

RANK_WORKER_RULE = (
    "rank workers are the server's descendants whose command line names a tensor-parallel rank: "
    "SGLang's process title 'sglang::scheduler_TP<r>' (also with DP/PP/EP parts; plain "
    "'sglang::scheduler' is rank 0 of a TP=1 server), or an argument "
    "'--tp-rank <r>' / '--rank <r>' / 'tp_rank=<r>'. When no descendant names a rank, every Python "
    "descendant except multiprocessing's helpers (resource_tracker, forkserver) and SGLang's other "
    "processes (sglang::detokenizer, sglang::tokenizer_worker, ...) counts, numbered 0, 1, ... in pid order."
)

_TITLE_RANK = re.compile(r"scheduler(?:_[A-Z]+\d+)*_TP(\d+)")
# sglang/srt/managers/scheduler.py::run_scheduler_process titles a scheduler `sglang::scheduler` plus
# `_TP<r>` only when tp_size > 1: without it, the one scheduler of a TP=1 server is rank 0.
_TITLE_TP1 = re.compile(r"^sglang::scheduler(?:_(?:DP|PP|ATTN_CP|MOE_DP|EP)\d+)*$")
# SGLang's processes that are not schedulers (detokenizer_manager.py, multi_tokenizer_mixin.py,
# data_parallel_controller.py): never rank workers, whatever the fallback counts.
_SGLANG_OTHER = re.compile(r"^sglang::(?!scheduler)")
_ARG_RANK = re.compile(r"^(?:--tp-rank|--tp_rank|--rank)(?:=(\d+))?$")
_KV_RANK = re.compile(r"\btp_rank=(\d+)\b")
_MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "multiprocessing.semaphore_tracker")


def rank_from_cmdline(cmdline: Sequence[str]) -> int | None:
    """The tensor-parallel rank a command line names, or None."""
    for i, arg in enumerate(cmdline):
        m = _TITLE_RANK.search(arg) or _KV_RANK.search(arg)
        if m:
            return int(m.group(1))
        if _TITLE_TP1.match(arg.strip()):
            return 0
        m = _ARG_RANK.match(arg)
        if m:
            if m.group(1) is not None:
                return int(m.group(1))
            if i + 1 < len(cmdline) and cmdline[i + 1].isdigit():
                return int(cmdline[i + 1])
    return None


def _is_python(snap: ProcessSnapshot) -> bool:
    names = [os.path.basename(snap.exe or ""), os.path.basename(snap.cmdline[0]) if snap.cmdline else ""]
    return any(re.match(r"python\d*(\.\d+)?$", n) for n in names)


def rank_workers(server_pid: int, snapshots: Sequence[ProcessSnapshot]) -> list[tuple[int, ProcessSnapshot]]:
    """(rank, process) pairs by RANK_WORKER_RULE, sorted by rank then pid. With data parallelism
    several processes may name the same TP rank; all of them are workers."""
    children = sorted((s for s in snapshots if s.pid != server_pid), key=lambda s: s.pid)
    named = [(rank, s) for s in children if (rank := rank_from_cmdline(s.cmdline)) is not None]
    if named:
        return sorted(named, key=lambda rs: (rs[0], rs[1].pid))
    fallback = [
        s
        for s in children
        if _is_python(s)
        and not any(h in " ".join(s.cmdline) for h in _MP_HELPERS)
        and not (s.cmdline and _SGLANG_OTHER.match(s.cmdline[0]))
    ]
    return list(enumerate(fallback))


class ProcessEnv(Frozen):
    """What one process got of the requested environment."""

    pid: int
    ppid: int | None = None
    cmdline: str = ""
    """Redacted and cut to 300 characters."""
    rank: int | None = None
    """Tensor-parallel rank when the process is a rank worker."""
    readable: bool = True
    environ_source: str = "own"
    """Whose environment was read: "own" (/proc/<pid>/environ), or, when the process's own view was
    overwritten by its process title (_overwritten_by_title), "sibling <pid> ..." or "parent <pid>"."""
    present: tuple[str, ...] = ()
    """Requested variables present with the requested value."""
    missing: tuple[str, ...] = ()
    mismatched: dict[str, str] = Field(default_factory=dict)
    """Requested variables present with another value: name -> the value found (redacted)."""
    nccl_env: dict[str, str] = Field(default_factory=dict)
    """Every NCCL_* variable the process has, requested or not (SGLang sets some itself)."""
    nice: int | None = None
    """The nice value it ran at (Ray starts its workers, and so the servers they launch, 15 above its
    raylet unless the cluster says otherwise: niceness_warning holds it against the sweep's own)."""


class EnvObservation(Frozen):
    """Proof (or not) that the requested environment reached every rank worker."""

    server_pid: int
    requested: dict[str, str]
    expected_ranks: int
    rule: str = RANK_WORKER_RULE
    processes: tuple[ProcessEnv, ...] = ()
    workers: dict[int, int] = Field(default_factory=dict)
    """pid -> rank of every rank worker found."""
    ok: bool
    problems: tuple[str, ...] = ()


def _fmt_ranks(items: Sequence[ProcessEnv]) -> str:
    label = "rank" if len(items) == 1 else "ranks"
    return f"{label} " + ", ".join(f"{p.rank} (pid {p.pid})" for p in items)


def _overwritten_by_title(snap: ProcessSnapshot) -> bool:
    """Whether /proc/<pid>/environ no longer holds the process's environment: SGLang retitles its
    processes with setproctitle (`sglang::scheduler_TP0`, `sglang::detokenizer`), which on Linux reuses
    the memory of argv and of the initial environment for the title, so the kernel's view of the
    environment becomes the title's padding (seen on a real 0.5.23 CPU server at TP=2: no PATH, no
    variable at all). Such a process was started by multiprocessing's spawn with its parent's
    environment, which is then the one read."""
    title = bool(snap.cmdline) and snap.cmdline[0].startswith("sglang::")
    return title and snap.environ is not None and "PATH" not in snap.environ


def _spawned_environ(
    snap: ProcessSnapshot, snapshots: Sequence[ProcessSnapshot], by_pid: Mapping[int, ProcessSnapshot]
) -> tuple[dict[str, str] | None, str]:
    """The environment a retitled process was spawned with: that of a sibling multiprocessing started from
    the same parent and left untitled (its resource_tracker: the parent's os.environ at spawn time, with
    the variables SGLang sets itself before spawning), else the parent's initial one."""
    for other in snapshots:
        if (
            other.ppid == snap.ppid
            and other.pid != snap.pid
            and other.environ is not None
            and "PATH" in other.environ
            and any("multiprocessing" in a for a in other.cmdline)
        ):
            return other.environ, f"sibling {other.pid} (spawned by the same parent, not retitled)"
    parent = by_pid.get(snap.ppid) if snap.ppid is not None else None
    if parent is not None and parent.environ is not None:
        return parent.environ, f"parent {parent.pid}"
    return snap.environ, "own"


def evaluate_env(
    server_pid: int,
    snapshots: Sequence[ProcessSnapshot],
    requested: Mapping[str, str],
    expected_ranks: int,
) -> EnvObservation:
    """Compare the requested variables against what each process got (pure; see observe_env)."""
    requested = {k: str(v) for k, v in requested.items()}
    ranks = rank_workers(server_pid, snapshots)
    rank_by_pid = {snap.pid: rank for rank, snap in ranks}
    processes = []
    by_pid = {snap.pid: snap for snap in snapshots}
    for snap in sorted(snapshots, key=lambda s: s.pid):
        env, source = snap.environ, "own"
        if _overwritten_by_title(snap):
            env, source = _spawned_environ(snap, snapshots, by_pid)
        present, missing, mismatched = [], [], {}
        if env is not None:
            for name, want in requested.items():
                if name not in env:
                    missing.append(name)
                elif env[name] != want:
                    mismatched[name] = env[name]
                else:
                    present.append(name)
        nccl = {k: v for k, v in (env or {}).items() if k.startswith("NCCL_")}
        processes.append(
            ProcessEnv(
                pid=snap.pid,
                ppid=snap.ppid,
                cmdline=redact_text(" ".join(snap.cmdline))[:300],
                rank=rank_by_pid.get(snap.pid),
                readable=env is not None,
                environ_source=source,
                present=tuple(present),
                missing=tuple(missing),
                mismatched=redact_env(mismatched),
                nccl_env=redact_env(nccl),
                nice=snap.nice,
            )
        )

    workers = sorted((p for p in processes if p.rank is not None), key=lambda p: (p.rank, p.pid))
    problems = []
    if len(workers) < expected_ranks:
        problems.append(f"found {len(workers)} rank worker(s) under pid {server_pid}, expected {expected_ranks}")
    unreadable = [p for p in workers if not p.readable]
    if unreadable:
        problems.append(f"could not read the environment of {_fmt_ranks(unreadable)}")
    shown = redact_env(requested)
    for name in requested:
        lacking = [p for p in workers if name in p.missing]
        if lacking:
            problems.append(f"{name} did not reach {_fmt_ranks(lacking)}")
        for p in workers:
            if name in p.mismatched:
                problems.append(
                    f"{name} reached rank {p.rank} (pid {p.pid}) as {p.mismatched[name]!r}, requested {shown[name]!r}"
                )
    return EnvObservation(
        server_pid=server_pid,
        requested=shown,
        expected_ranks=expected_ranks,
        processes=tuple(processes),
        workers={p.pid: p.rank for p in workers if p.rank is not None},
        ok=not problems,
        problems=tuple(problems),
    )


def niceness_warning(observation: EnvObservation, launcher_nice: int) -> str | None:
    """A line when the server's processes ran at a higher nice value than `launcher_nice`, the niceness of
    the process that launched the sweep (the priority the user chose, `nice sweep run ...` included):
    on a host with other CPU work (the sweep itself, Ray's daemons, another trial's client) SGLang's
    tokenizer, scheduler and detokenizer then got less CPU than the user gave the sweep, and what the
    trial measured is slower than what it describes. Ray starts its workers RAY_worker_niceness (its
    `worker_niceness` setting, 15 by default) above its raylet's nice value; the private instance the tool
    starts sets 0, so its servers run at the sweep's own niceness."""
    niced = sorted({p.nice for p in observation.processes if p.nice is not None and p.nice > launcher_nice})
    if not niced:
        return None
    return (
        f"the server's processes ran at niceness {', '.join(map(str, niced))}, above the sweep's own "
        f"({launcher_nice}): with other CPU work on the host the server got less CPU than the sweep; start the "
        "Ray cluster's nodes with RAY_worker_niceness=0 in their environment (`RAY_worker_niceness=0 ray start ...`)"
    )


def observe_env(server_pid: int, requested: Mapping[str, str], expected_ranks: int) -> EnvObservation:
    """Read the environment of the server's process tree from /proc and check the requested
    variables on every rank worker (rule: RANK_WORKER_RULE)."""
    return evaluate_env(server_pid, snapshot_tree(server_pid), requested, expected_ranks)


# ---------------------------------------------------------------------------------------------
# NCCL's own account (NCCL_DEBUG=INFO): nccllog.py parses it; here it is held against the request

NcclRankInfo = DeviceLog
"""What NCCL printed for one device (nccllog.DeviceLog; the name the trial's callers know)."""

_TUNER_PLUGIN = "NCCL_TUNER_PLUGIN"


def check_env_applied(
    requested: Mapping[str, str],
    observation: EnvObservation,
    nccl_info: Mapping[int, DeviceLog] | None = None,
) -> tuple[bool, str]:
    """(ok, reason). Not ok (the trial is env_not_applied) when a requested variable is missing or
    different on any rank worker, or when NCCL's log shows it on some devices but not others or
    with another value. A variable NCCL never mentions is not held against the trial, with one
    exception: a requested NCCL_TUNER_PLUGIN must show `TUNER/Plugin: Using <name>` on every rank
    (nccllog.tuner_problems), since NCCL falls back to its internal tuner without an error."""
    requested = {k: str(v) for k, v in requested.items()}
    problems = list(observation.problems)
    confirmed = []
    nccl_info = nccl_info or {}
    if nccl_info:
        problems += env_problems(requested, nccl_info, nccl_info)
        confirmed = [
            name
            for name in requested
            if name.startswith("NCCL_")
            and name not in NOT_ECHOED
            and all(name in log.env for log in nccl_info.values())
            and all(log.env[name] == requested[name] for log in nccl_info.values())
        ]
    plugin = requested.get(_TUNER_PLUGIN)
    ranks = sorted(set(observation.workers.values())) or list(range(observation.expected_ranks))
    if plugin and plugin.lower() != "none":
        tuner = tuner_problems(plugin, nccl_info, sorted(set(ranks) | set(nccl_info)))
        problems += tuner
        if not tuner:
            loaded = sorted({log.tuner.plugin for log in nccl_info.values() if log.tuner.plugin})
            confirmed.append(f"the tuner plugin ({', '.join(loaded)})")
    if problems:
        return False, "environment not applied: " + "; ".join(problems)
    reason = (
        f"all {len(requested)} requested variable(s) reached all {len(observation.workers)} rank worker(s)"
        if requested
        else f"no variables requested; {len(observation.workers)} rank worker(s) found"
    )
    if confirmed and nccl_info:
        reason += f"; NCCL confirmed {', '.join(confirmed)} on {len(nccl_info)} device(s)"
    return True, reason


# ---------------------------------------------------------------------------------------------
# Fingerprint

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
        fp["server_python"] = python
        found, why = interpreter_versions(python, run=run)
        if why is None:
            fp.update(found)
        else:
            fp.update({k: None for k in _PACKAGES})
            fp["versions_error"] = why
    if nccl_log:
        versions = sorted({i.version for i in parse_nccl_log(nccl_log).values() if i.version})
        fp["nccl"] = ", ".join(versions) or None

    keys = [k for _, k in _GPU_FIELDS]
    query = [q for q, _ in _GPU_FIELDS]
    out, why = None, None
    for extra in (_OPTIONAL_GPU_FIELDS, ()):
        q = query + [e for e, _ in extra]
        out, why = _call(run, ["nvidia-smi", f"--query-gpu={','.join(q)}", "--format=csv,noheader,nounits"])
        if out is not None or why == "absent":
            keys = keys + [k for _, k in extra]
            break
    if out is None:
        fp.update({"gpu_count": 0, "nvidia_smi": why if why == "absent" else f"failed: {why}"})
    else:
        gpus = parse_gpu_query(out, keys)
        fp.update(
            {
                "nvidia_smi": "ok",
                "gpu_count": len(gpus),
                "gpu_names": [g.get("name") for g in gpus],
                "driver": gpus[0].get("driver") if gpus else None,
                "pcie_gen_max": [g.get("pcie_gen_max") for g in gpus],
                "pcie_width_max": [g.get("pcie_width_max") for g in gpus],
                "gpus": gpus,
            }
        )
        header, _ = _call(run, ["nvidia-smi"])
        m = re.search(r"CUDA Version:\s*([\d.]+)", header or "")
        fp["cuda"] = m.group(1) if m else None
        topo, topo_why = _call(run, ["nvidia-smi", "topo", "-m"])
        fp["topology"] = _ANSI.sub("", topo).strip() if topo is not None else None
        if topo is None:
            fp["topology_error"] = topo_why
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
