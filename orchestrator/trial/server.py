"""Start, supervise and stop one server process (SGLang or the simulator).

The server runs in its own session (process group) with its output in a log file, never an unread
pipe. Readiness is polled with a deadline; stopping terminates then kills the whole group, so rank
workers and SGLang's scheduler/detokenizer children go with it. A pid file in the trial folder lets a
resumed driver reap a server orphaned by a killed one.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from orchestrator.records import LaunchPlan
from orchestrator.trial import procs


class Phase(str, enum.Enum):
    created = "created"
    starting = "starting"
    ready = "ready"
    exited = "exited"
    stopped = "stopped"


@dataclass(frozen=True)
class ReadyResult:
    ready: bool
    exited: bool = False
    returncode: int | None = None
    waited_s: float = 0.0


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str, low: int, high: int, *, start: int | None = None) -> int:
    """A port in [low, high] that is free now, scanning from `start` (spread concurrent trials)."""
    span = high - low + 1
    first = (start if start is not None else os.getpid()) % span
    for i in range(span):
        port = low + (first + i) % span
        if port_is_free(host, port):
            return port
    raise RuntimeError(f"no free port in server.port_range [{low}, {high}] on {host}")


def child_env(plan: LaunchPlan, base: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: the worker's own, minus any NCCL_/SGLANG_ variable the plan does not
    set (so nothing leaks in from the shell that started Ray), plus the plan's variables."""
    env = {k: v for k, v in base.items() if not k.startswith(("NCCL_", "SGLANG_"))}
    # Keep the device machine's safety setting even though it is not part of the plan.
    if "NCCL_NVLS_ENABLE" in base and "NCCL_NVLS_ENABLE" not in plan.env:
        env["NCCL_NVLS_ENABLE"] = base["NCCL_NVLS_ENABLE"]
    env.update(extra or {})
    env.update(plan.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class ServerProcess:
    """One supervised server: start, wait until ready, stop (whoever starts it stops it, whatever happened)."""

    def __init__(self, plan: LaunchPlan, log_path: Path, env: dict[str, str]):
        self.plan = plan
        self.log_path = Path(log_path)
        self.env = env
        self.phase = Phase.created
        self.proc: subprocess.Popen | None = None
        self.base_url = f"http://{plan.host}:{plan.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        if self.phase is not Phase.created:
            raise RuntimeError(f"start() called on a server in phase {self.phase.value}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                list(self.plan.argv),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        write_pid_record(self.log_path.parent / "server.pid", self.proc.pid, self.plan.argv)
        self.phase = Phase.starting

    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def exit_within(self, grace_s: float) -> int | None:
        """The exit status when the process ends within `grace_s` (a server that just closed its connections
        may still be dying), None when it is still running then or was never started."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            return None

    def wait_ready(self, timeout_s: float, *, poll_s: float = 0.25) -> ReadyResult:
        """Poll GET /health until 200, the process exits, or `timeout_s` passes."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        with httpx.Client(timeout=httpx.Timeout(5.0, connect=1.0), trust_env=False) as client:
            while True:
                rc = self.returncode()
                if rc is not None:
                    self.phase = Phase.exited
                    return ReadyResult(False, exited=True, returncode=rc, waited_s=time.monotonic() - t0)
                try:
                    # A 200 counts only from our own server: on a shared host another process may hold
                    # the port, answer /health, while ours exits with "address already in use".
                    if client.get(self.base_url + "/health").status_code == 200 and self._ours():
                        self.phase = Phase.ready
                        return ReadyResult(True, waited_s=time.monotonic() - t0)
                except httpx.HTTPError:
                    pass
                if time.monotonic() >= deadline:
                    return ReadyResult(False, waited_s=time.monotonic() - t0)
                time.sleep(poll_s)

    def _ours(self) -> bool:
        """Whether the process listening on the plan's port is this server (or one of its children)."""
        pid = self.pid
        return pid is not None and procs.listens_on(pid, self.plan.port) is not False

    def get(self, path: str, timeout_s: float = 10.0) -> httpx.Response | None:
        """A GET that returns None instead of raising when the server does not answer."""
        try:
            return httpx.get(self.base_url + path, timeout=timeout_s, trust_env=False)
        except httpx.HTTPError:
            return None

    def stop(self, grace_s: float = 10.0) -> list[str]:
        """SIGTERM the whole process group, SIGKILL what is left after `grace_s`; return problems."""
        problems: list[str] = []
        if self.proc is None or self.phase is Phase.stopped:
            return problems
        problems += kill_group(self.proc.pid, grace_s, wait=self.proc.wait)
        self.phase = Phase.stopped
        with contextlib.suppress(OSError):
            (self.log_path.parent / "server.pid").unlink()
        return problems


def kill_group(pgid: int, grace_s: float, *, wait: Callable[..., object] | None = None) -> list[str]:
    """Terminate then kill process group `pgid`; collect problems instead of raising the first."""
    problems: list[str] = []
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return problems
    except PermissionError as exc:
        return [f"cannot signal process group {pgid}: {exc}"]
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if wait is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                wait(timeout=0.1)
        else:
            time.sleep(0.1)
        if not procs.group_alive(pgid):
            return problems
    try:
        os.killpg(pgid, signal.SIGKILL)
        problems.append(f"process group {pgid} ignored SIGTERM for {grace_s:.0f}s; killed")
    except ProcessLookupError:
        pass
    if wait is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            wait(timeout=5)
    return problems


def write_pid_record(path: Path, pid: int, argv: Sequence[str]) -> None:
    """Record the server's pid with what a stranger cannot share: its start time and its full argv."""
    path.write_text(json.dumps({"pid": pid, "start": procs.start_time(pid), "argv": list(argv)}) + "\n")


def _pid_record(trial_dir: Path) -> tuple[int, float, tuple[str, ...]] | None:
    """(pid, start time, argv without blank arguments) of `trial_dir`/server.pid, or None for a record
    that is missing, empty, unreadable or malformed."""
    try:
        record = json.loads((Path(trial_dir) / "server.pid").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    pid, start, argv = record.get("pid"), record.get("start"), record.get("argv")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or not isinstance(start, (int, float)):
        return None
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return None
    wanted = tuple(a.strip() for a in argv if a.strip())
    return (pid, float(start), wanted) if wanted else None


def recorded_server(trial_dir: Path) -> int | None:
    """The pid in `trial_dir`/server.pid when that very process still runs (same pid, start time and full
    argv); None for a record that is missing, empty, unreadable or names any other process."""
    record = _pid_record(trial_dir)
    if record is None:
        return None
    pid, start, wanted = record
    now = procs.start_time(pid)
    # The start time alone tells a reused pid from ours; the argv guards against a record written by hand.
    if now is None or abs(now - start) > 1e-3 or procs.cmdline(pid) != wanted:
        return None
    return pid


def reap_orphan(trial_dir: Path) -> str | None:
    """Kill a server left behind by a killed driver (its pid file names that very process); say what was done."""
    pid_file = Path(trial_dir) / "server.pid"
    if not pid_file.is_file():
        return None
    msg = None
    if (pid := recorded_server(trial_dir)) is not None:
        kill_group(pid, 5.0)
        msg = f"killed orphaned server process group {pid} of {trial_dir.name}"
    with contextlib.suppress(OSError):
        pid_file.unlink()
    return msg


def tail(path: Path, lines: int = 60, max_bytes: int = 64_000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])
