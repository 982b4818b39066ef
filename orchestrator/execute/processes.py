"""Processes a killed driver leaves behind, found and ended through /proc (no Ray needed to read them)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from orchestrator.trial.server import recorded_server


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a live pid from a reused one)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def local_processes() -> list[dict[str, Any]]:
    """Every process descending from this one (the local Ray instance: GCS, raylet, agents, workers).

    `ray.init(address="local")` makes GCS and raylet die with the driver, but when the driver is
    SIGKILLed the raylet's agents (DashboardAgent, RuntimeEnvAgent) outlive it for a minute or more.
    The driver writes this list to its work directory so a resumed driver can end them
    (`reap_processes`).
    """
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    parents[int(entry.name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent:
                frontier.append(pid)
                start = start_time(pid)
                if start is not None:
                    found.append({"pid": pid, "start": start, "cmd": cmdline(pid)[:200]})
    return found


def valid_records(data: object) -> list[dict[str, Any]] | None:
    """The process records of a ray-processes.json document (pid > 1, start ticks, non-empty command), or
    None when the document does not have that shape; a record with a wrong shape makes it all untrusted."""
    if not isinstance(data, dict) or not isinstance(data.get("processes", []), list):
        return None
    out = []
    for r in data.get("processes", []):
        if not isinstance(r, dict):
            return None
        pid, start, cmd = r.get("pid"), r.get("start"), r.get("cmd")
        if (
            not isinstance(pid, int)
            or isinstance(pid, bool)
            or pid <= 1
            or not isinstance(start, int)
            or isinstance(start, bool)
            or not isinstance(cmd, str)
            or not cmd.strip()
        ):
            return None
        out.append({"pid": pid, "start": start, "cmd": cmd})
    return out


def _same(r: dict[str, Any]) -> bool:
    """Whether the recorded process still runs: same pid, start time and (the first 200 characters of) argv."""
    pid = int(r["pid"])
    return pid != os.getpid() and start_time(pid) == int(r["start"]) and cmdline(pid)[:200] == r["cmd"]


def reap_processes(recorded: list[dict[str, Any]], grace_s: float = 3.0) -> list[str]:
    """End the recorded processes (`valid_records`) that still run; say which."""
    alive = [r for r in recorded if _same(r)]
    for r in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(r["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_same(r) for r in alive):
        time.sleep(0.1)
    for r in alive:
        if _same(r):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(r["pid"]), signal.SIGKILL)
    return [f"{r['pid']} ({r['cmd'][:60]})" for r in alive]


def kill_server_now(trial_dir: Path) -> None:
    """SIGKILL the process group of the trial's server (server.pid), if the record names that very server."""
    pid = recorded_server(trial_dir)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
