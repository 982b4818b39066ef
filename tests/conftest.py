"""Fixtures shared by the end-to-end tests: one real sweep, run once per session and read by many."""

from __future__ import annotations

import os

import pytest
from e2e_helpers import demo_experiment, sweep, write_experiment


@pytest.fixture(autouse=True)
def _restore_environ():
    """No test leaks environment changes into the next (httpx's conftest does the same)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def finished_sweep(tmp_path_factory):
    """A real 6-trial sweep (2 in flight, local Ray, simulator, sqlite Optuna and MLflow), finished."""
    tmp = tmp_path_factory.mktemp("e2e")
    exp = write_experiment(tmp, demo_experiment(name="e2e", budget={"trials": 6, "concurrent_trials": 2}))
    wd = tmp / "wd"
    proc = sweep("run", str(exp), "--workdir", str(wd))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return wd, proc
