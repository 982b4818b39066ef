"""`sweep plan` says each quantity once and agrees with the schedule the sweep starts with
(sweep.schedule.night_plan): one trial's minutes and the trials that fit; it warns when budget.trials cannot
fit the night and when a model path is missing or a placeholder; its launch examples set no knob the host
makes inert. Its output, piped, keeps each message on one line, and `--json` carries the same figures."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from e2e_helpers import SWEEP
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config import experiment as spec_mod
from orchestrator.probe.settings import planned_settings
from orchestrator.sweep import schedule

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "experiments" / "demo.yaml"
KIMI = REPO / "experiments" / "kimi-k2.5-tp8.yaml"


def _night(path: Path, host: str | None = None) -> schedule.NightPlan:
    s = spec_mod.load(path)
    if host is not None:
        s = s.model_copy(update={"simulator": s.simulator.model_copy(update={"hardware_profile": host})})
    return schedule.night_plan(s, probe_settings=planned_settings(s))


def _plan(*args: str) -> str:
    result = CliRunner().invoke(app, ["plan", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize(
    ("experiment", "host"),
    [(DEMO, None), (KIMI, None), (KIMI, "h200-nvlink-x8"), (KIMI, "pcie-rtxpro6000-x8")],
    ids=["demo", "kimi", "kimi-h200", "kimi-pcie"],
)
def test_one_figure_per_quantity_and_the_schedules(experiment: Path, host: str | None) -> None:
    text = _plan(str(experiment), "--limit", "1", *(["--host", host] if host else []))
    night = _night(experiment, host)
    minutes = {float(m) for m in re.findall(r"([\d.]+) min(?! per| =)", text.split("confirmation:")[0])}
    per_trial = re.search(r"^one trial: ([\d.]+) min = ", text, re.M)
    assert per_trial is not None, text
    assert float(per_trial.group(1)) == round(night.trial_s / 60, 1)
    assert minutes == {round(night.trial_s / 60, 1)}, f"one trial's minutes said as {minutes}"
    fits = re.findall(r"about (\d+) trial\(s\)", text)
    assert fits == [str(night.trials)], f"the trials that fit said as {fits}"
    data = json.loads(_plan(str(experiment), "--limit", "1", "--json", *(["--host", host] if host else [])))
    assert data["night"]["trials_fit"] == night.trials
    assert data["night"]["trial_minutes"] == pytest.approx(night.trial_s / 60, abs=1e-3)


def test_a_budget_the_night_cannot_hold_is_a_warning() -> None:
    text = _plan(str(KIMI), "--limit", "1", "--host", "h200-nvlink-x8")
    fit = _night(KIMI, "h200-nvlink-x8").trials
    assert fit < spec_mod.load(KIMI).budget.trials
    assert re.search(rf"^warning: budget\.trials 120 cannot fit the night: about {fit} fit", text, re.M), text
    demo = _plan(str(DEMO), "--limit", "1")
    assert "budget.trials 20 ends the search before the night would" in demo and "cannot fit" not in demo


def test_missing_and_placeholder_model_paths_are_flagged(tmp_path: Path) -> None:
    here = _plan(str(KIMI), "--limit", "1")
    assert "warning: server.model: /models/Kimi-K2.5 is no directory on this machine, so every trial" in here
    elsewhere = _plan(str(KIMI), "--limit", "1", "--host", "h200-nvlink-x8")
    assert "check that it exists at that path on every h200-nvlink-x8 host" in elsewhere
    data = yaml.safe_load(KIMI.read_text())
    data["server"]["model"] = "/path/to/your/model"
    data["server"]["draft_model"] = str(tmp_path)  # a directory that exists: nothing to say
    data["search_space"] = [str(REPO / "search_spaces" / n) for n in ("nccl.yaml", "eagle3.yaml")]
    edited = tmp_path / "placeholder.yaml"
    edited.write_text(yaml.safe_dump(data))
    text = _plan(str(edited), "--limit", "1")
    assert "server.model: /path/to/your/model looks like a placeholder" in text
    assert "server.draft_model" not in text


def test_launch_examples_set_no_knob_the_host_makes_inert() -> None:
    # H200 NVLink: FlashInfer fusion carries decode and verify; NCCL knobs matter only at the nccl backend.
    h200 = json.loads(_plan(str(KIMI), "--limit", "8", "--json", "--host", "h200-nvlink-x8"))["launches"]
    assert len(h200) > 3
    for launch in h200:
        nccl = {k: v for k, v in launch["params"].items() if k.startswith("NCCL_") and v is not None}
        assert not nccl or launch["params"].get("all_reduce_backend") == "nccl", launch["params"]
    # PCIe: the backend knob is not searched, so no example sets it.
    pcie = json.loads(_plan(str(KIMI), "--limit", "8", "--json", "--host", "pcie-rtxpro6000-x8"))["launches"]
    assert all(launch["params"].get("all_reduce_backend") is None for launch in pcie)


def test_piped_output_keeps_each_message_on_one_line(tmp_path: Path) -> None:
    piped = subprocess.run(
        [*SWEEP, "plan", str(KIMI), "--limit", "2", "--host", "h200-nvlink-x8"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "80"},  # what rich would otherwise wrap at
    )
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.splitlines()
    budget = [line for line in lines if line.startswith("warning: budget.trials")]
    assert len(budget) == 1 and budget[0].endswith("(budget.concurrent_trials)"), "the warning is one line"
    launches = [line for line in lines if "sglang.launch_server" in line]
    assert len(launches) == 2 and all("--tp-size 8" in line and "--port" in line for line in launches)
    assert max(len(line) for line in lines) > 80, "long lines are not cut at rich's 80 columns"


def test_help_names_no_bool_type() -> None:
    result = CliRunner().invoke(app, ["plan", "--help"])
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout and "--json" in result.stdout
