"""A new user's first minute with a finished simulator sweep, in a real Chromium: `sweep ui` opens the
classic training view on the trials ranked by the objective with the columns that answer "which and how
much", the parent run describes the champion, and report.html answers which, how much and why.
Screenshots go to the test's temporary folder; with SWEEP_UPDATE_SCREENSHOTS=1 they replace the ones in
docs/screenshots/ that README links (a test run never edits the repository otherwise)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from browser_helpers import CHROMIUM, FLAGS, serving_ui
from e2e_helpers import SWEEP
from ports import free_port

pytestmark = pytest.mark.slow

DOC_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    if os.environ.get("SWEEP_UPDATE_SCREENSHOTS") == "1":
        return DOC_SHOTS
    return tmp_path


@pytest.fixture
def ui(finished_sweep):
    wd, _ = finished_sweep
    with serving_ui(wd) as (base, port, proc):
        yield base, port, wd, proc
    proc.wait(timeout=20)


def _printed_url(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    text = ""
    while "viewStateShareKey" not in text:
        text += proc.stdout.readline()
    return re.search(r"(http://\S+)", " ".join(text.split())).group(1)  # type: ignore[union-attr]


def test_a_new_user_lands_on_the_ranked_trials_and_the_champion(ui, shots):
    from playwright.sync_api import sync_playwright

    base, port, wd, proc = ui
    summary = json.loads((wd / "summary.json").read_text())
    state = json.loads((wd / "sweep.json").read_text())
    champion = summary["champion"]["number"]
    url = _printed_url(proc)
    # A second `sweep ui` on the same port fails instead of pointing at this server.
    taken = subprocess.run(
        [*SWEEP, "ui", "--workdir", str(wd), "--port", str(port)], capture_output=True, text=True, timeout=120
    )
    assert taken.returncode == 2 and "not free" in taken.stderr
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})  # a laptop's window, not a wall
        page.goto(url, wait_until="domcontentloaded")
        rows = page.get_by_text(re.compile(r"^(trial|baseline)-\d{4}$"))
        rows.first.wait_for(timeout=60_000)
        close_assistant(page)
        # The training view (the printed URL says so), not GenAI's: its sidebar has no evaluations.
        assert "workflowType=machine_learning" in page.url
        assert not page.get_by_text(re.compile("^Evaluations?$")).count(), "the GenAI sidebar"
        assert rows.first.inner_text() == f"trial-{champion:04d}", "the deployed trial ranks first"
        body = page.inner_text("body")
        for column in ("decode_tok_s", "speedup_pct", "accept_length", "verify_ms"):
            assert column in body, f"{column} not visible without picking columns"
        space = json.loads((wd / "experiment.json").read_text())["space"]["params"]
        knobs = sorted(space)[:2]  # MLflow orders the knob columns by name
        for knob in knobs:  # in view without scrolling or picking columns
            header = page.get_by_role("columnheader", name=knob).first
            header.wait_for(timeout=30_000)
            box = header.bounding_box()
            assert box is not None and box["x"] + box["width"] <= 1400, f"knob column {knob} not in view at 1,400 px"
        assert "confirm-" not in body, "confirmation runs are not ranked with the trials"
        assert "The latest sweep's run" in body, "the experiment's note links the sweep's run"
        page.screenshot(path=str(shots / "mlflow-trials.png"))
        # The parent run's description: which and how much, with links.
        page.goto(
            f"{base}/#/experiments/{url.split('/experiments/')[1].split('/')[0]}/runs/{state['parent_run_id']}",
            wait_until="domcontentloaded",
        )
        page.get_by_text(re.compile(rf"(deployed|champion) trial {champion}\b")).first.wait_for(timeout=60_000)
        assert "gain" in page.inner_text("body").lower()
        page.screenshot(path=str(shots / "mlflow-parent.png"))
        browser.close()


def close_assistant(page: Any) -> None:
    """Close the MLflow Assistant, which MLflow opens by itself on a browser's first visit (a third of the
    page), a moment after the page loads."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    close = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]')
    try:
        close.first.wait_for(timeout=20_000)
    except PlaywrightTimeout:
        return  # not opened in this MLflow
    close.first.click()
    close.first.wait_for(state="detached", timeout=20_000)


REPORT_MAX_BYTES = 1_500_000
WINDOW_PX = 1400


def test_the_report_is_light_fits_a_window_and_answers_at_the_top(finished_sweep, shots):
    from playwright.sync_api import sync_playwright

    wd, _ = finished_sweep
    champion = json.loads((wd / "summary.json").read_text())["champion"]["number"]
    report = wd / "report.html"
    assert report.stat().st_size < REPORT_MAX_BYTES, f"report.html is {report.stat().st_size} bytes"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": WINDOW_PX, "height": 900})
        page.goto(report.as_uri(), wait_until="load")
        text = page.inner_text("body").lower()  # the cards' labels are upper-cased by CSS
        assert f"trial {champion}" in text and "how much:" in text and "why" in text
        history = page.locator("#history ~ .plot svg.chart")
        assert history.count() >= 1, "the objective's history is drawn"
        assert history.first.bounding_box()["width"] <= WINDOW_PX  # type: ignore[index]
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= WINDOW_PX, f"the page scrolls sideways: {width} px in a {WINDOW_PX} px window"
        assert page.locator("script").count() == 0, "no script: the page opens at once, offline"
        page.screenshot(path=str(shots / "report.png"), full_page=False)
        browser.close()


def test_the_notebook_draws_its_plots_and_shows_the_champion_row(finished_sweep, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    wd, _ = finished_sweep
    repo = Path(__file__).resolve().parents[2]
    nb = nbformat.read(repo / "notebooks" / "analysis.ipynb", as_version=4)
    monkeypatch.setenv("SWEEP_WORKDIR", str(wd))
    monkeypatch.delenv("MPLBACKEND", raising=False)
    NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(repo / "notebooks")}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the plot cell draws inline"
    champion = json.loads((wd / "summary.json").read_text())["champion"]["number"]
    tables = [
        o["data"]["text/plain"]
        for o in outputs
        if "text/plain" in o.get("data", {}) and "champion" in o["data"]["text/plain"]
    ]
    assert any(re.search(rf"^\s*\d+\s+{champion}\s+True\b", t, re.M) for t in tables), "the champion's row is marked"
    assert not any("params.sampler" in t or "params.budget_trials" in t for t in tables), "the parent's params"
    printed = "".join(o.get("text", "") for o in outputs)
    assert "confirmation runs left out" in printed
    assert "baseline drift: " in printed, "the drift cell says what it found"


def _answering(url: str, proc: subprocess.Popen[str], deadline_s: float = 180) -> None:
    """Wait until `url` answers 200 (fail with the command's output when it exits or the deadline passes)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"{url} did not answer: {proc.communicate()[0]}")


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("command", ["ui", "dashboard"])
def test_kill_stops_every_server_the_command_started(finished_sweep, command):
    wd, _ = finished_sweep
    port = free_port()
    proc = subprocess.Popen(
        [*SWEEP, command, "--workdir", str(wd), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    started: list[psutil.Process] = []
    try:
        _answering(base + ("/health" if command == "ui" else "/api/studies"), proc)
        started = psutil.Process(proc.pid).children(recursive=True)
        assert started, "the server runs as a child of the command"
        if command == "dashboard":  # the objective is named after the metric, not "Objective 0"
            study_id = httpx.get(base + "/api/studies").json()["study_summaries"][0]["study_id"]
            assert httpx.get(f"{base}/api/studies/{study_id}").json()["objective_names"] == ["decode_tok_s"]
        proc.send_signal(signal.SIGTERM)  # what `kill PID` sends: to the command alone, not to its group
        assert proc.wait(timeout=120) == 0
        _, alive = psutil.wait_procs(started, timeout=30)
        assert not alive, f"still running after kill: {[p.cmdline() for p in alive]}"
        assert not _listening(port), f"something still answers on {port}"
    finally:
        for p in [*started, psutil.Process(proc.pid)] if proc.poll() is None else started:
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_report_to_a_file_touches_nothing_else_and_speaks_json(finished_sweep, tmp_path):
    wd, _ = finished_sweep
    kept = {name: (wd / name).read_bytes() for name in ("report.html", "mlflow.db")}
    artifacts = sorted(p.relative_to(wd) for p in (wd / "mlartifacts").rglob("*"))
    target = tmp_path / "elsewhere.html"
    got = subprocess.run(
        [*SWEEP, "report", "--workdir", str(wd), "-o", str(target), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr
    data = json.loads(got.stdout)
    summary = json.loads((wd / "summary.json").read_text())
    assert data["path"] == str(target) and data["published"] is False
    assert data["champion_trial"] == summary["champion"]["number"] and data["verdict"]
    assert target.stat().st_size > 0
    assert {name: (wd / name).read_bytes() for name in kept} == kept, "-o writes only there"
    assert sorted(p.relative_to(wd) for p in (wd / "mlartifacts").rglob("*")) == artifacts, "nothing uploaded"
