"""The MLflow UI as users browse it in the morning: `sweep ui` serves the sweep's store, and a real
Chromium (Debian's package, driven by Playwright) shows the sweep, its trials and the champion."""

from __future__ import annotations

import contextlib
import json
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

pytestmark = pytest.mark.slow

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


@pytest.fixture
def ui_server(finished_sweep):
    wd, _ = finished_sweep
    with serving_ui(wd) as (base, _port, _proc):
        yield base, wd


def test_mlflow_ui_shows_the_sweep_its_trials_and_the_champion(ui_server, tmp_path):
    from playwright.sync_api import sync_playwright

    base, wd = ui_server
    state = json.loads((wd / "sweep.json").read_text())
    summary = json.loads((wd / "summary.json").read_text())
    exp_id = httpx.get(
        f"{base}/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": state["experiment"]}
    ).json()["experiment"]["experiment_id"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(f"{base}/#/experiments/{exp_id}/runs", wait_until="domcontentloaded")
        parent = page.get_by_text("sweep-", exact=False).first
        parent.wait_for(timeout=60_000)
        page.screenshot(path=str(tmp_path / "runs.png"))
        # The parent's run page lists its children (nested runs) and its results artifacts.
        page.goto(f"{base}/#/experiments/{exp_id}/runs/{state['parent_run_id']}", wait_until="domcontentloaded")
        page.get_by_text("best_decode_tok_s").first.wait_for(timeout=60_000)
        # The champion's registered model with its alias.
        page.goto(f"{base}/#/models/{state['model_name']}", wait_until="domcontentloaded")
        page.get_by_text("champion").first.wait_for(timeout=60_000)
        page.get_by_text(f"Version {summary['model_version']}").first.wait_for(timeout=30_000)
        page.screenshot(path=str(tmp_path / "model.png"))
        browser.close()
