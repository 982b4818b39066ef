"""The MLflow UI as users browse it in the morning: `sweep ui` serves the sweep's store, and a real
Chromium (Debian's package, driven by Playwright) shows the sweep, its trials and the champion."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time

import httpx
import pytest
from e2e_helpers import SWEEP

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ui_server(finished_sweep):
    wd, _ = finished_sweep
    port = _free_port()
    proc = subprocess.Popen([*SWEEP, "ui", "--workdir", str(wd), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"sweep ui did not serve within 90 s: {proc.stdout.read() if proc.stdout else ''}")
    yield base, wd
    import os

    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=20)


def test_mlflow_ui_shows_the_sweep_its_trials_and_the_champion(ui_server, tmp_path):
    from playwright.sync_api import sync_playwright

    base, wd = ui_server
    state = json.loads((wd / "sweep.json").read_text())
    summary = json.loads((wd / "summary.json").read_text())
    exp_id = httpx.get(f"{base}/api/2.0/mlflow/experiments/get-by-name",
                       params={"experiment_name": state["experiment"]}).json()["experiment"]["experiment_id"]
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
