"""Trial failures are data: a server that never becomes ready, one that dies mid-benchmark, one that
runs out of memory and one whose collective hangs each give a FAILED trial of the right kind with the
log tail, leave no process behind, and the sweep goes on."""

from __future__ import annotations

import json
import os
import uuid

import pytest
import yaml

from e2e_helpers import demo_experiment, sweep, write_experiment

pytestmark = pytest.mark.slow


def _processes_marked(marker: str) -> list[int]:
    """Processes that inherited this test's marker variable: the sweep's servers and rank workers
    (other tests running at the same time on the machine have their own simulators)."""
    pids = []
    needle = f"SWEEP_TEST_MARKER={marker}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                env = open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if needle in env:
                pids.append(int(entry))
    return pids


def test_failed_trials_have_the_right_kind_and_the_sweep_goes_on(tmp_path):
    space = tmp_path / "proto.yaml"
    space.write_text(yaml.safe_dump({"name": "proto", "params": {
        "NCCL_PROTO": {"choices": [None, "LL", "LL128", "Simple"]},
        "NCCL_ALGO": {"choices": [None, "Tree"]},
    }}))
    data = demo_experiment(
        name="failures",
        search_space=[str(space)],
        server={"startup_timeout_s": 4},
        simulator={"faults": [
            {"fault": "never_ready", "when": {"NCCL_PROTO": "LL128", "NCCL_ALGO": None}},
            {"fault": "crash_after_tokens=20", "when": {"NCCL_PROTO": "Simple", "NCCL_ALGO": None}},
            {"fault": "nccl_hang_when=NCCL_ALGO:Tree", "when": {"NCCL_PROTO": "LL"}},
        ]},
        sampler={"kind": "grid", "seed": 0},
        budget={"trials": 8, "concurrent_trials": 2, "max_failure_rate": 0.9, "max_consecutive_failures": 8},
        promotion={"confirm_repeats": 0},
        benchmark={"stall_timeout_s": 3},
    )
    data["search_space"] = [str(space)]
    exp = write_experiment(tmp_path, data)
    marker = uuid.uuid4().hex
    wd = tmp_path / "wd"
    proc = sweep("run", str(exp), "--workdir", str(wd), env={"SWEEP_TEST_MARKER": marker})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr

    kinds = {}
    for d in sorted((wd / "trials").iterdir()):
        o = json.loads((d / "outcome.json").read_text())
        p = o["params"]
        kinds[(p["NCCL_PROTO"], p["NCCL_ALGO"])] = (o["status"], o["failure_kind"], o["log_tail"], o["reason"])
    assert len(kinds) == 8, kinds  # every grid point was measured: failures did not stop the sweep
    assert kinds[("LL128", None)][:2] == ("FAILED", "startup_timeout")
    status, kind, tail, reason = kinds[("Simple", None)]
    assert (status, kind) == ("FAILED", "server_crash") and "exit code 1" in reason and tail
    assert kinds[("LL", "Tree")][:2] == ("FAILED", "nccl_hang")
    assert kinds[(None, None)][0] == "COMPLETE" and kinds[("LL", None)][0] == "COMPLETE"
    assert _processes_marked(marker) == []  # no server, rank worker or Ray process left running
    status_proc = sweep("status", "--workdir", str(wd))
    assert "startup_timeout 1" in status_proc.stdout and "server_crash 1" in status_proc.stdout
