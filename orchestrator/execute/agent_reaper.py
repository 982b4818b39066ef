"""Ray's agents end with the driver that started the private Ray instance.

The instance's head processes (gcs_server, raylet, the monitors) are the driver's children, and Ray makes
the kernel kill them when the driver dies (PR_SET_PDEATHSIG). The raylet's own children, the dashboard and
runtime-env agents, are not: they notice the raylet is gone by polling its pid, then spend up to 60 s
telling a GCS that is gone too (ray/_private/process_watcher.py: publish_error_to_driver's timeout of 60).
Measured with Ray 2.60 after a SIGKILL of the driver: both agents lived on for 60-70 s.

`start` runs this module as a watchdog beside the instance. It waits on a pipe whose only writer is the
driver, noting the raylet's children every second meanwhile (the agents' environment does not name the
raylet; its workers' does, RAY_RAYLET_PID). The pipe closes when the driver ends, however it ends (exit,
Ctrl-C, SIGKILL), and the watchdog then ends every process the raylet started: SIGTERM, then SIGKILL after
a grace period. It writes what it ended, one JSON line, to stdout (a log).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

_GRACE_S = 3.0
_NOTE_EVERY_S = 1.0


def start(raylet: psutil.Process, log: Path) -> subprocess.Popen[bytes]:
    """The watchdog of the raylet `raylet`, logging to `log`; it acts when the returned process's stdin
    closes (the driver keeps it open for its lifetime). The raylet's children of now (its agents) are
    named on the command line: the driver may be killed before the watchdog first looks."""
    children = [f"{p.pid}@{p.create_time()!r}" for p in raylet.children(recursive=True)]
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.execute.agent_reaper",
                str(raylet.pid),
                repr(raylet.create_time()),
                *children,
            ],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C to the driver's terminal must not end the watchdog first
        )


def _named(words: list[str]) -> dict[int, psutil.Process]:
    """The processes `pid@create_time` words name that still run (a recycled pid is left alone)."""
    found = {}
    for word in words:
        pid, _, started = word.partition("@")
        try:
            proc = psutil.Process(int(pid))
            if proc.create_time() == float(started):
                found[proc.pid] = proc
        except (psutil.Error, ValueError):
            continue
    return found


def started_by(raylet_pid: int, raylet_started: float) -> list[psutil.Process]:
    """This user's processes that raylet `raylet_pid` started (their environment names it; started after it,
    so a recycled pid is not taken for it)."""
    found = []
    wanted = str(raylet_pid)
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.create_time() >= raylet_started and proc.environ().get("RAY_RAYLET_PID") == wanted:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def end(procs: list[psutil.Process]) -> list[int]:
    """SIGTERM to each of `procs`, SIGKILL to those alive after the grace period; the pids that were alive."""
    alive = []
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
            alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    _, stubborn = psutil.wait_procs(alive, timeout=_GRACE_S)
    for proc in stubborn:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(stubborn, timeout=_GRACE_S)
    return [p.pid for p in alive]


def _closed(stream: object) -> threading.Event:
    """An event set when `stream` (the pipe from the driver) reaches its end."""
    done = threading.Event()

    def read() -> None:
        sys.stdin.buffer.read()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    return done


def main(argv: list[str]) -> int:
    raylet_pid, raylet_started = int(argv[0]), float(argv[1])
    noted = _named(argv[2:])
    driver_gone = _closed(sys.stdin)
    while True:
        try:
            raylet = psutil.Process(raylet_pid)
            if raylet.create_time() == raylet_started:
                noted.update({p.pid: p for p in raylet.children(recursive=True)})
        except psutil.Error:
            pass  # the raylet is gone: what it started is noted, or named in its environment
        if driver_gone.wait(_NOTE_EVERY_S):
            break
    found = {p.pid: p for p in started_by(raylet_pid, raylet_started)}
    alive = [p for p in {**noted, **found}.values() if p.is_running()]
    ended = end(alive)
    print(json.dumps({"raylet": raylet_pid, "ended": ended, "at": time.time(), "watchdog": os.getpid()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
