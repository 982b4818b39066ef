"""`--ray-address` naming a cluster that is not there: one message in seconds, not minutes of Ray retries."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

from e2e_helpers import SWEEP, demo_experiment, write_experiment


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.9", 0))
        return int(s.getsockname()[1])  # closed again when the with-block ends: nothing listens there


def test_an_unreachable_ray_address_fails_fast_with_one_message(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path, demo_experiment(name="noray", budget={"trials": 2}))
    address = f"127.0.0.9:{_closed_port()}"
    started = time.monotonic()
    proc = subprocess.run([*SWEEP, "run", str(exp), "--workdir", str(tmp_path / "wd"), "--ray-address", address],
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"cannot join the Ray cluster at {address}: nothing answers there" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert took < 60, f"took {took:.0f} s"
    state = json.loads((tmp_path / "wd" / "sweep.json").read_text())
    assert state["status"] == "failed"
