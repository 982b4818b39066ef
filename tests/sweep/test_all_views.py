"""Every view of one finished sweep names the same deployed trial, knobs and gain (issue 33): summary.json,
the run's final print, `sweep status`, report.html, the MLflow parent run (description, link, star), the
registry version (description, source run), `sweep truth --workdir` and the exported env file, all
rendered from the one Verdict (orchestrator/verdict). Two sweeps on the model-backed executor (real
Optuna, MLflow sqlite and registry): one where the runner-up, not the search's pick, is deployed, and one
where no gate ran, where no view may say "confirmed"."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import demo_experiment, write_experiment
from loop_helpers import near_tie, run_sweep
from mlflow import MlflowClient
from mlflow_fixtures import sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.cli import check, running
from orchestrator.cli._app import out
from orchestrator.config import experiment as spec_mod
from orchestrator.results import export
from orchestrator.sweep import publish
from orchestrator.sweep import state as st
from orchestrator.tracking import convert
from orchestrator.verdict.value import Verdict


def ungated() -> dict:
    """The demo's space with no gate (promotion.max_rounds: 0): promoted on one measurement, unconfirmed."""
    return demo_experiment(
        name="views", budget={"trials": 6, "concurrent_trials": 2}, promotion={"max_rounds": 0, "min_gain": 0.0}
    )


def _printed(fn, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    """What a CLI function printed on the tool's console."""
    with out.capture() as captured:
        fn(*args, **kwargs)
    return captured.get()


def views(tmp_path: Path, data: dict, wd: Path, summary: st.SweepSummary) -> dict[str, str]:
    """Each view of the finished sweep, as text."""
    spec_path = write_experiment(tmp_path, data, name="again.yaml")
    spec = spec_mod.load(spec_path)
    publish.publish(wd)
    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    parent = client.get_run(summary.parent_run_id or "")
    exported = tmp_path / "exported.env"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "export",
            "--workdir",
            str(wd),
            "--format",
            "env",
            "-o",
            str(exported),
        ],
        check=True,
        capture_output=True,
    )
    out: dict[str, str] = {
        "final print": _printed(running._print_summary, spec, summary, wd),
        "sweep status": _printed(running.status, workdir=wd, storage=None, as_json=False),
        "sweep truth": _printed(check.truth, experiment=spec_path, top=1, workdir=wd),
        "report.html": (wd / "report.html").read_text(),
        "parent run": parent.data.tags[convert.NOTE_TAG],
        "env file": exported.read_text(),
    }
    versions = client.search_model_versions("name='sglang-sweep-demo'")
    if versions:
        out["registry version"] = versions[0].description or ""
    return out


def _pct(gain: float) -> str:
    return f"{gain * 100:+.1f}%"


def test_every_view_names_the_deployed_runner_up_its_knobs_and_gain(tmp_path, sqlite_store_template):
    data = near_tie(tmp_path, max_rounds=6, name="views")  # the runner-up wins in the same rounds
    wd, summary, _, _ = run_sweep(tmp_path, sqlite_store_template, data)
    v = summary.the_verdict()
    assert v is not None and v.deployed is not None and v.pick is not None and v.figures is not None
    assert summary.promoted_config == "runner_up" and v.deployed.number != v.pick.number, summary.verdict
    assert v.replaced.startswith(f"trial {v.deployed.number} was deployed instead of trial {v.pick.number}")
    kept = Verdict.model_validate_json(Verdict.model_dump_json(summary.decision))  # type: ignore[arg-type]
    assert kept == v  # summary.json holds the value every view reads

    deployed, pick, gain = v.deployed, v.pick, _pct(v.figures.gain)
    knobs = {k: str(val) for k, val in deployed.params.items()}
    seen = views(tmp_path, data, wd, summary)
    assert set(seen) == {
        "final print",
        "sweep status",
        "sweep truth",
        "report.html",
        "parent run",
        "env file",
        "registry version",
    }
    for name in ("final print", "sweep status", "parent run", "registry version"):
        text = seen[name]
        assert f"eployed: trial {deployed.number} (instead of trial {pick.number}" in text, (name, text)
        assert gain in text, (name, gain, text)
        for k, val in knobs.items():
            assert re.search(rf"{k}\s*=\s*{re.escape(val)}", text), (name, k, val, text)
    assert f"deployed (trial {deployed.number}): true decode_tok_s" in seen["sweep truth"], seen["sweep truth"]
    page = seen["report.html"]
    assert "Which: deployed" in page and f'<div class="big">trial {deployed.number}</div>' in page
    assert f"<code>NCCL_P2P_LEVEL={knobs.get('NCCL_P2P_LEVEL')}</code>" in page or "NCCL_P2P_LEVEL" not in knobs
    assert gain in page
    env = export.parse_env(seen["env file"])
    assert f"trial: {deployed.number}" in seen["env file"]
    assert all(env.get(k) == val for k, val in knobs.items() if k.startswith("NCCL_"))
    assert seen["parent run"].splitlines()[0].endswith(f"deployed trial {deployed.number}")
    assert f"[trial {deployed.number}]" in seen["parent run"]  # the run linked is the deployed trial's

    status_json = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "status", "--workdir", str(wd), "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    decision = json.loads(status_json)["decision"]  # `sweep status --json`: the same Verdict for scripts
    assert decision["deployed"]["number"] == deployed.number and decision["figures"]["gain"] == v.figures.gain

    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    [version] = client.search_model_versions("name='sglang-sweep-demo'")
    assert version.run_id == v.run_id
    assert client.get_run(version.run_id).data.tags["sweep.trial_number"] == str(deployed.number)
    runs = client.search_runs([client.get_run(version.run_id).info.experiment_id])
    assert [r.info.run_id for r in runs if r.data.tags.get(convert.CHAMPION_TAG)] == [v.run_id]  # MLflow's star


@pytest.mark.parametrize("views_of", ["ungated"])
def test_without_a_gate_no_view_says_confirmed(tmp_path, sqlite_store_template, views_of):
    data = ungated()
    wd, summary, _, _ = run_sweep(tmp_path, sqlite_store_template, data)
    v = summary.the_verdict()
    assert v is not None and summary.outcome is st.Outcome.unconfirmed, summary.verdict
    assert v.deployed is not None and v.figures is not None and not v.gated
    seen = views(tmp_path, data, wd, summary)
    for name, text in seen.items():
        lowered = text.lower()
        said = lowered.count("confirmed") - lowered.count("unconfirmed")
        assert said == 0, (name, [m.start() for m in re.finditer("confirmed", lowered)], text[:3000])
    for name in ("final print", "sweep status", "parent run", "registry version"):
        assert f"trial {v.deployed.number}" in seen[name] and _pct(v.figures.gain) in seen[name], (name, seen[name])
        assert "UNCONFIRMED" in seen[name] or "Unconfirmed" in seen[name], (name, seen[name])
