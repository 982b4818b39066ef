"""The MLflow UI served for a browser, shared by the UI tests: Debian's Chromium and its headless flags,
and `sweep ui` on a sweep's store until /health answers."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_helpers import SWEEP
from ports import free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def serving_ui(wd: Path, deadline_s: float = 180) -> Iterator[tuple[str, int, subprocess.Popen]]:
    """`sweep ui` on the sweep's store until /health answers: (base URL, port, process); stopped after."""
    port = free_port()
    proc = subprocess.Popen(
        [*SWEEP, "ui", "--workdir", str(wd), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"sweep ui did not serve within {deadline_s:.0f} s: {proc.stdout.read() if proc.stdout else ''}")
    try:
        yield base, port, proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
