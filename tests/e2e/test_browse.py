"""A new user's first minute with a finished simulator sweep, in a real Chromium: `sweep ui` opens the
classic training view on the trials ranked by the objective with the columns that answer "which and how
much", the parent run describes the champion, and report.html answers which, how much and why.
Screenshots go to the test's temporary folder; with SWEEP_UPDATE_SCREENSHOTS=1 they replace the ones in
docs/screenshots/ that README links (a test run never edits the repository otherwise)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, FLAGS, serving_ui
from e2e_helpers import SWEEP

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
        page = browser.new_page(viewport={"width": 2400, "height": 1000})
        page.goto(url, wait_until="domcontentloaded")
        page.get_by_text("Training runs").first.wait_for(timeout=60_000)  # the classic view, not GenAI's
        first = page.get_by_text(f"trial-{champion:04d}").first
        first.wait_for(timeout=60_000)
        body = page.inner_text("body")
        for column in ("decode_tok_s", "speedup_pct", "accept_length", "verify_ms"):
            assert column in body, f"{column} not visible without picking columns"
        assert "★ champion" in body, "the champion's run is marked"
        assert "confirm-" not in body, "confirmation runs are not ranked with the trials"
        page.screenshot(path=str(shots / "mlflow-trials.png"))
        # The parent run's description: which and how much, with links.
        page.goto(
            f"{base}/#/experiments/{url.split('/experiments/')[1].split('/')[0]}/runs/{state['parent_run_id']}",
            wait_until="domcontentloaded",
        )
        page.get_by_text(f"champion trial {champion}").first.wait_for(timeout=60_000)
        assert "Confirmed gain" in page.inner_text("body")
        page.screenshot(path=str(shots / "mlflow-parent.png"))
        # report.html: which, how much, why and the history, offline.
        page.goto((wd / "report.html").as_uri(), wait_until="load")
        text = page.inner_text("body").lower()  # the cards' labels are upper-cased by CSS
        assert f"trial {champion}" in text and "how much: confirmed gain" in text and "why" in text
        assert page.locator("#optuna-history .plot-container").count() == 1, "history drawn"
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
    printed = "".join(o.get("text", "") for o in outputs)
    assert "confirmation runs left out" in printed
