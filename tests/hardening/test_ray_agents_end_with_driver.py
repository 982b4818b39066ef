"""Issue 38 (hardening, round three): Ray's agents end with a killed driver.

A driver starts the tool's private Ray instance (execute.ray_actor.init_local) and is killed with SIGKILL.
Ray's head processes die with it (the kernel's parent-death signal); the raylet's agents used to live on
for 60-70 s (Ray 2.60's agents wait out a 60 s publish to the dead GCS). The watchdog
(execute.agent_reaper) ends them: once it has exited, none of the driver's descendants is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

_DRIVER = """
import time
from orchestrator.execute.ray_actor import init_local
init_local(num_gpus=1, num_cpus=2)
print("ready", flush=True)
time.sleep(600)
"""


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_no_ray_process_outlives_a_killed_driver(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER], stdout=subprocess.PIPE, text=True, env={**env, "HOME": str(home)}
    )
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "ready"
        descendants = psutil.Process(driver.pid).children(recursive=True)
        names = {p.pid: p.name() for p in descendants}
        watchdogs = [p for p in descendants if "orchestrator.execute.agent_reaper" in " ".join(p.cmdline())]
        assert len(watchdogs) == 1, names
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= set(names.values()), names
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    # A hang guard, not a speed check: the watchdog exits once it has ended what the raylet started.
    psutil.wait_procs(watchdogs, timeout=120)
    assert _gone(watchdogs[0]), "the watchdog is still running"
    left = {p.pid: names[p.pid] for p in descendants if not _gone(p)}
    for pid in left:  # leave nothing behind should the check fail
        os.kill(pid, signal.SIGKILL)
    assert not left, f"outlived the killed driver: {left}"
