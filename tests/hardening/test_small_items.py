"""Smaller items of issue 23, through the CLI in process (typer's CliRunner) and the status reader: each
mistake gets one message that names the fix, and clock skew shows no negative time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from e2e_helpers import demo_experiment, write_experiment
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config import experiment as spec_mod
from orchestrator.errors import SweepError
from orchestrator.sweep._workdir import WorkdirLock
from orchestrator.sweep.status import status_report


def _error(argv: list[str]) -> str:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return " ".join(result.output.split())


def test_truth_top_must_be_positive(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path, demo_experiment(name="top"))
    assert "Invalid value for '--top'" in _error(["truth", str(exp), "--top", "-1"])


def test_export_output_under_a_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    text = _error(["export", "-o", str(tmp_path / "afile" / "x.env"), "--workdir", str(tmp_path)])
    assert f"{tmp_path / 'afile'} is a file, not a folder" in text


def test_report_output_at_a_directory_says_so_before_any_work(tmp_path: Path) -> None:
    text = _error(["report", "-o", str(tmp_path), "--workdir", str(tmp_path / "nowhere")])
    assert f"-o {tmp_path}: is a directory; name the file to write, e.g. -o {tmp_path / 'report.html'}" in text


def test_a_lock_that_is_a_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / ".lock").mkdir()
    with pytest.raises(SweepError, match=r"\.lock is a directory, where the sweep keeps its lock file; remove it"):
        WorkdirLock(tmp_path).acquire()


def test_clock_skew_shows_no_negative_elapsed_time(tmp_path: Path) -> None:
    spec = spec_mod.load(write_experiment(tmp_path, demo_experiment(name="skew")))
    (tmp_path / "sweep.json").write_text(
        json.dumps({"experiment": spec.name, "status": "running", "started_at": time.time() + 3600, "budget_trials": 3})
    )
    report = status_report(tmp_path)
    assert report.elapsed_s == 0.0  # started an hour ahead: clamped, not negative
    assert report.eta_s is None or report.eta_s >= 0


def test_a_refused_start_prints_no_banner(tmp_path: Path) -> None:
    from orchestrator.execute.inline import InlineExecutor
    from orchestrator.sweep.driver import Sweep

    exp = write_experiment(tmp_path, demo_experiment(name="banner"))
    wd = tmp_path / "wd"
    wd.mkdir()
    Sweep(spec_mod.load(exp), wd, executor=InlineExecutor(1)).open()  # a sweep is there
    result = CliRunner().invoke(app, ["run", str(exp), "--workdir", str(wd)])
    assert result.exit_code == 2, result.output
    assert "already holds a sweep" in result.output
    assert "sweep banner (" not in result.output, result.output


def _bare_sweep(tmp_path: Path) -> Path:
    """A work directory with only a sweep.json that names no MLflow store nor model (as a start left it, or
    a hand-edited one)."""
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "sweep.json").write_text(
        json.dumps({"experiment": "demo", "status": "finished", "started_at": 1.0, "budget_trials": 3})
    )
    return wd


def test_a_cut_short_experiment_json_is_not_called_another_version(tmp_path: Path) -> None:
    wd = _bare_sweep(tmp_path)
    (wd / "experiment.json").write_text('{"name": "demo", "engine": "simu')
    text = _error(["report", "--no-mlflow", "--workdir", str(wd)])
    assert f"{wd / 'experiment.json'} cannot be read" in text and "cut short" in text
    assert "another version" not in text


def test_export_from_a_sweep_json_that_names_no_registry_says_so(tmp_path: Path) -> None:
    """It used to say `Could not reach MLflow at  to resolve models:/@champion` (an empty URI and name)."""
    wd = _bare_sweep(tmp_path)
    text = _error(["export", "-o", str(tmp_path / "c.env"), "--workdir", str(wd)])
    assert f"{wd / 'sweep.json'} names no tracking_uri and model_name" in text
    assert "--tracking-uri URI --model NAME" in text and "Could not reach MLflow" not in text
