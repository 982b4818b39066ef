"""`--ray-address` naming a cluster that is not there: one message from a single connection attempt, not
minutes of Ray retries."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from e2e_helpers import SWEEP, demo_experiment, write_experiment


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.9", 0))
        return int(s.getsockname()[1])  # closed again when the with-block ends: nothing listens there


def test_an_unreachable_ray_address_fails_fast_with_one_message(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path, demo_experiment(name="noray", budget={"trials": 2}))
    address = f"127.0.0.9:{_closed_port()}"
    proc = subprocess.run(
        [*SWEEP, "run", str(exp), "--workdir", str(tmp_path / "wd"), "--ray-address", address],
        capture_output=True,
        text=True,
        timeout=900,
    )  # a hang guard, not a speed check
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # The refusal of one TCP connection, before ray.init (which would retry for minutes) is called:
    # this message, with the socket's own error, comes only from that check.
    assert (
        f"cannot join the Ray cluster at {address}: nothing answers there ([Errno 111] Connection refused)"
        in proc.stderr
    ), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    state = json.loads((tmp_path / "wd" / "sweep.json").read_text())
    assert state["status"] == "failed"
