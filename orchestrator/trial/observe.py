"""What really ran: the environment each rank worker got, NCCL's own account of its settings, which
all-reduce carried the decode/verify messages, and the host's fingerprint.

Thin shells read the process tree (procs) and run nvidia-smi (fingerprint.py); everything they read goes through
pure functions (evaluate_env, check_env_applied, fingerprint_hash; nccllog's parse_nccl_log; allreduce.py's
allreduce_path and plan_warnings) that the tests drive with text in the real formats.

/proc/<pid>/environ shows the environment a process was exec'ed with. SGLang starts its scheduler
processes with multiprocessing's spawn method (a fresh exec that inherits the launcher's
environment, including the NCCL_* variables SGLang sets itself before spawning), so it shows what
NCCL in each rank reads. A process that forks without exec and then changes its environment is
not seen correctly; NCCL's `... set by environment to ...` lines (NCCL_DEBUG=INFO) are the
independent cross-check.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import Field

from orchestrator.nccllog import NOT_ECHOED, DeviceLog, env_problems, parse_nccl_log, tuner_problems
from orchestrator.records import Frozen
from orchestrator.redact import redact_env, redact_text
from orchestrator.trial import procs
from orchestrator.trial.allreduce import allreduce_path, check_backend_applied, plan_warnings
from orchestrator.trial.fingerprint import (
    STABLE_FIELDS,
    fingerprint,
    fingerprint_diff,
    fingerprint_hash,
    interpreter_versions,
    parse_gpu_query,
)

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
    "interpreter_versions",
    "niceness_warning",
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
parse_nccl_log is nccllog.py's (NCCL's line formats are documented there); the fingerprint's names are
fingerprint.py's."""


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


def _compared(
    env: Mapping[str, str] | None, requested: Mapping[str, str]
) -> tuple[list[str], list[str], dict[str, str]]:
    """(present, missing, mismatched name -> value found) of the requested variables in `env`."""
    present: list[str] = []
    missing: list[str] = []
    mismatched: dict[str, str] = {}
    if env is None:
        return present, missing, mismatched
    for name, want in requested.items():
        if name not in env:
            missing.append(name)
        elif env[name] != want:
            mismatched[name] = env[name]
        else:
            present.append(name)
    return present, missing, mismatched


def _process_env(
    snap: ProcessSnapshot,
    snapshots: Sequence[ProcessSnapshot],
    by_pid: Mapping[int, ProcessSnapshot],
    requested: Mapping[str, str],
    rank: int | None,
) -> ProcessEnv:
    """What one process got of the requested variables (its spawner's environment when retitled)."""
    env, source = snap.environ, "own"
    if _overwritten_by_title(snap):
        env, source = _spawned_environ(snap, snapshots, by_pid)
    present, missing, mismatched = _compared(env, requested)
    nccl = {k: v for k, v in (env or {}).items() if k.startswith("NCCL_")}
    return ProcessEnv(
        pid=snap.pid,
        ppid=snap.ppid,
        cmdline=redact_text(" ".join(snap.cmdline))[:300],
        rank=rank,
        readable=env is not None,
        environ_source=source,
        present=tuple(present),
        missing=tuple(missing),
        mismatched=redact_env(mismatched),
        nccl_env=redact_env(nccl),
        nice=snap.nice,
    )


def _worker_problems(
    server_pid: int, workers: Sequence[ProcessEnv], requested: Mapping[str, str], expected_ranks: int
) -> list[str]:
    """One line per rank worker missing, unreadable, or lacking or differing on a requested variable."""
    problems = []
    if len(workers) < expected_ranks:
        problems.append(f"found {len(workers)} rank worker(s) under pid {server_pid}, expected {expected_ranks}")
    unreadable = [p for p in workers if not p.readable]
    if unreadable:
        problems.append(f"could not read the environment of {_fmt_ranks(unreadable)}")
    shown = redact_env(dict(requested))
    for name in requested:
        lacking = [p for p in workers if name in p.missing]
        if lacking:
            problems.append(f"{name} did not reach {_fmt_ranks(lacking)}")
        problems += [
            f"{name} reached rank {p.rank} (pid {p.pid}) as {p.mismatched[name]!r}, requested {shown[name]!r}"
            for p in workers
            if name in p.mismatched
        ]
    return problems


def evaluate_env(
    server_pid: int,
    snapshots: Sequence[ProcessSnapshot],
    requested: Mapping[str, str],
    expected_ranks: int,
) -> EnvObservation:
    """Compare the requested variables against what each process got (pure; see observe_env)."""
    requested = {k: str(v) for k, v in requested.items()}
    rank_by_pid = {snap.pid: rank for rank, snap in rank_workers(server_pid, snapshots)}
    by_pid = {snap.pid: snap for snap in snapshots}
    processes = [
        _process_env(snap, snapshots, by_pid, requested, rank_by_pid.get(snap.pid))
        for snap in sorted(snapshots, key=lambda s: s.pid)
    ]
    workers = sorted((p for p in processes if p.rank is not None), key=lambda p: (p.rank, p.pid))
    problems = _worker_problems(server_pid, workers, requested, expected_ranks)
    return EnvObservation(
        server_pid=server_pid,
        requested=redact_env(requested),
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


def _nccl_confirmed(requested: Mapping[str, str], nccl_info: Mapping[int, DeviceLog]) -> list[str]:
    """The requested NCCL variables NCCL echoed on every device with the requested value."""
    return [
        name
        for name in requested
        if name.startswith("NCCL_")
        and name not in NOT_ECHOED
        and all(name in log.env for log in nccl_info.values())
        and all(log.env[name] == requested[name] for log in nccl_info.values())
    ]


def _tuner_check(
    requested: Mapping[str, str], observation: EnvObservation, nccl_info: Mapping[int, DeviceLog]
) -> tuple[list[str], list[str]]:
    """(problems, confirmed) of a requested NCCL_TUNER_PLUGIN: every rank must show it loaded."""
    plugin = requested.get(_TUNER_PLUGIN)
    if not plugin or plugin.lower() == "none":
        return [], []
    ranks = sorted(set(observation.workers.values())) or list(range(observation.expected_ranks))
    tuner = tuner_problems(plugin, nccl_info, sorted(set(ranks) | set(nccl_info)))
    if tuner:
        return tuner, []
    loaded = sorted({log.tuner.plugin for log in nccl_info.values() if log.tuner.plugin})
    return [], [f"the tuner plugin ({', '.join(loaded)})"]


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
    nccl_info = nccl_info or {}
    problems = list(observation.problems)
    confirmed = []
    if nccl_info:
        problems += env_problems(requested, nccl_info, nccl_info)
        confirmed = _nccl_confirmed(requested, nccl_info)
    tuner, tuner_confirmed = _tuner_check(requested, observation, nccl_info)
    problems += tuner
    confirmed += tuner_confirmed
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
