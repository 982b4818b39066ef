"""A sweep on real SGLang servers stopped the two ways a night ends early: Ctrl-C (twice: abort the trial in
flight) and a SIGKILL of the driver. `--resume` settles what the kill left (a server still running in its
own session is reaped from its server.pid record), measures the killed trial again and finishes the budget;
nothing of any run is left running."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

from e2e_helpers import (
    marked_processes,
    new_workdir,
    resume,
    start_sweep,
    trial_files,
    wait_for,
    wait_until_gone,
    write_experiment,
)
from mlflow_fixtures import sqlite_store_template  # noqa: F401 (fixture)
from real_helpers import cpu_experiment, write_space


def _server_ready(wd: Path) -> Path | None:
    """The folder of a launched trial whose real server said it is ready, if any."""
    for d in sorted((wd / "trials").glob("*")) if (wd / "trials").is_dir() else []:
        log = d / "server.log"
        if (
            (d / "server.pid").exists()
            and log.exists()
            and "The server is fired up and ready to roll!" in log.read_text()
        ):
            return d
    return None


def _sglang(processes: dict[int, str]) -> dict[int, str]:
    return {pid: cmd for pid, cmd in processes.items() if "sglang" in cmd}


def test_ctrl_c_and_sigkill_then_resume_leave_nothing_running(
    tmp_path: Path, sglang_python: str, tiny_model: Path, sqlite_store_template: Path
) -> None:
    data = cpu_experiment(
        "real-stop", tiny_model, sglang_python, write_space(tmp_path), budget={"trials": 2}, benchmark={"repeats": 1}
    )
    exp = write_experiment(tmp_path, data)
    wd = new_workdir(tmp_path, sqlite_store_template)
    marker = uuid.uuid4().hex

    # 1. Ctrl-C twice (SIGINT to the foreground group, as a terminal sends it) while a real server is up
    log1 = tmp_path / "run1.log"
    proc = start_sweep(exp, wd, marker, log1)
    try:
        wait_for(lambda: _server_ready(wd), proc, log1, timeout_s=900)
        assert _sglang(marked_processes(marker))  # the launcher, its scheduler and detokenizer are running
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.5)  # the first press is seen before the second
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log1.read_text()
    assert rc == 1, text
    assert "Traceback" not in text
    assert "aborting the trials in flight" in text and "--resume" in text
    assert wait_until_gone(marker, timeout_s=60) == {}  # SGLang's launcher, scheduler, detokenizer; Ray
    finished, running = trial_files(wd)
    assert not running and all(o["failure_kind"] == "interrupted" for o in finished.values()), finished

    # 2. SIGKILL of the driver alone while a resumed trial's server is up. What it leaves depends on the
    # stack: here Ray takes the actor's children down with it (the launcher, then its scheduler and
    # detokenizer by PR_SET_PDEATHSIG: sglang/srt/utils/common.py::kill_itself_when_parent_died) but a
    # Ray worker may stay; a server that survives is reaped from its server.pid record by --resume.
    log2 = tmp_path / "run2.log"
    proc = start_sweep(exp, wd, marker, log2, "--resume")
    try:
        folder = wait_for(lambda: _server_ready(wd), proc, log2, timeout_s=900)
        server_pid = json.loads((folder / "server.pid").read_text())["pid"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(2)
    left = marked_processes(marker)

    # 3. --resume settles the killed trial, measures it again and finishes the budget; nothing is left running
    resumed = resume(exp, wd, marker)
    assert wait_until_gone(marker, timeout_s=60) == {}, f"left after the kill: {left}"
    if server_pid in left:
        sweep_log = (wd / "sweep.log").read_text()
        assert f"killed orphaned server process group {server_pid} of {folder.name}" in sweep_log + resumed.stdout
    assert not (folder / "server.pid").exists()
    finished, running = trial_files(wd)
    complete = [o for o in finished.values() if o["status"] == "COMPLETE"]
    assert not running and len(complete) == 2, {n: (o["status"], o["reason"]) for n, o in finished.items()}
    assert all(o["metrics"]["decode_tok_s"] > 0 for o in complete)
    assert json.loads((wd / "summary.json").read_text())["verdict"]
