"""The MLflow UI as users browse it in the morning: `sweep ui` serves the sweep's store, and a real
Chromium (Debian's package, driven by Playwright) shows the sweep, its trials and the champion."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from browser_helpers import CHROMIUM, FLAGS, serving_ui

from orchestrator.tracking import convert

pytestmark = pytest.mark.slow


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
        # The parent's run page, by the link the tool writes: the training view's, not GenAI's "Evaluations".
        page.goto(f"{base}/{convert.run_path(exp_id, state['parent_run_id'])}", wait_until="domcontentloaded")
        page.get_by_text("best_decode_tok_s").first.wait_for(timeout=60_000)
        assert not page.get_by_text(re.compile("^Evaluations?$")).count(), "a run page in the GenAI view"
        # The champion's registered model with its alias.
        page.goto(f"{base}/#/models/{state['model_name']}", wait_until="domcontentloaded")
        page.get_by_text("champion").first.wait_for(timeout=60_000)
        page.get_by_text(f"Version {summary['model_version']}").first.wait_for(timeout=30_000)
        page.screenshot(path=str(tmp_path / "model.png"))
        # The version's page shows the knobs it serves, as its `knob.<name>` tags.
        version = httpx.get(
            f"{base}/api/2.0/mlflow/model-versions/get",
            params={"name": state["model_name"], "version": summary["model_version"]},
        ).json()["model_version"]
        knobs = sorted(t["key"] for t in version.get("tags", []) if t["key"].startswith("knob."))
        assert knobs, "the registered version carries its knobs"
        page.goto(
            f"{base}/#/models/{state['model_name']}/versions/{summary['model_version']}?workflowType=machine_learning",
            wait_until="domcontentloaded",
        )
        page.get_by_text(knobs[0]).first.wait_for(timeout=60_000)
        page.screenshot(path=str(tmp_path / "model-version.png"))
        browser.close()
