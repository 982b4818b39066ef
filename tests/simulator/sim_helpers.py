"""Helpers for the simulator tests: run real simulator processes on 127.0.0.1, inspect process trees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from ports import free_port

TUNED = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def wait_gone(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """The pids still alive (not zombies) after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    alive = pids
    while True:
        alive = [p for p in alive if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class Sim:
    """One `python -m orchestrator.simulator` process with its log in a file."""

    def __init__(
        self,
        tmp_path: Path,
        *args: str,
        env: dict[str, str] | None = None,
        port: int | None = None,
        faults: tuple[str, ...] = (),
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"sim-{self.port}.log"
        argv = [
            sys.executable,
            "-m",
            "orchestrator.simulator",
            "--model-path",
            "kimi-k2.5",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *args,
        ]
        for f in faults:
            argv += ["--sim-fault", f]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SGLANG_", "SWEEP_SIM"))}
        full_env.update(env or {})
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            argv, env=full_env, stdout=self._log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2]
        )
        self.started = time.monotonic()
        self.workers_seen: list[int] = []

    def workers(self, expected: int, timeout_s: float = 5.0) -> list[int]:
        """The rank worker pids once `expected` of them run (remembered for the leftover check)."""
        deadline = time.monotonic() + timeout_s
        while True:
            kids = descendants(self.proc.pid)
            if len(kids) >= expected or time.monotonic() > deadline:
                self.workers_seen = sorted(set(self.workers_seen) | set(kids))
                return kids
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 20.0) -> float:
        """Seconds until /health answered 200; fails the test if the process exits first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"simulator exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        pytest.fail(f"simulator not ready after {timeout_s}s:\n{self.log()[-3000:]}")

    def wait_exit(self, timeout_s: float = 20.0) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"simulator still running after {timeout_s}s:\n{self.log()[-3000:]}")

    def stop(self) -> int | None:
        """SIGTERM, wait; SIGKILL the group as a last resort."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
