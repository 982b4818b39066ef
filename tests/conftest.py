"""Fixtures shared by the end-to-end tests: one real sweep, run once per session and read by many."""

from __future__ import annotations

import os

import pytest
from e2e_helpers import served_experiment, sweep, write_experiment

HEAVY_FIRST = (
    "tests/e2e/test_resume.py",
    "tests/e2e/test_interrupt.py",
    "tests/e2e/test_browse.py",
    "tests/e2e/test_e2e.py",
    "tests/e2e/test_ui.py",
    "tests/hardening/test_failed_start.py",
    "tests/results/test_truth_outputs.py",
    "tests/hardening/test_disk_full.py",
    "tests/sweep/test_confirm_adaptive.py",
    "tests/simulator/test_sim_outputs.py",
    "tests/search/test_overnight_bench.py",
    "tests/e2e/test_mlflow_outage.py",
    "tests/hardening/test_workdir_fuzz.py",
    "tests/hardening/test_mlflow_db_resume.py",
    "tests/e2e/test_verdict.py",
    "tests/e2e/test_failures.py",
    "tests/sweep/test_roundtrip.py",
    "tests/e2e/test_ray_cluster.py",
    "tests/sweep/test_loop.py",
    "tests/hardening/test_environment_failures.py",
    "tests/config/test_fuzz_hypothesis.py",
)
"""The files that take a worker longest (pytest --durations, docs/testing.md), about the heaviest first. `make
test` hands whole files to two workers in collection order (--dist loadfile --no-loadscope-reorder), and these
run first, so the many short files even out the end. xdist's own order (most tests first) left the long
files of few tests, sweeps each, to the end, where one worker ran them while the other had nothing left."""

SHARED_SWEEP = ("tests/e2e/test_browse.py", "tests/e2e/test_e2e.py", "tests/e2e/test_ui.py")
"""The files that read `finished_sweep`: given to one worker together, so the session runs that sweep once."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """HEAVY_FIRST's files first, in its order; every other file after them, in collection order."""
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """--dist loadfile, but SHARED_SWEEP's files are one unit of work (a session fixture lives per worker)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedSweepOnOneWorker(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return SHARED_SWEEP[0] if path in SHARED_SWEEP else path

    return SharedSweepOnOneWorker(config, log)


AMBIENT_PREFIXES = ("MLFLOW_", "NCCL_", "RAY_", "SGLANG_")
"""Settings of the caller's shell that would reach the sweeps, servers and Ray instances the tests start
(an MLFLOW_TRACKING_URI sent every in-process sweep to that server); RAY_TMPDIR, where Ray may write, stays."""


def pytest_configure(config: pytest.Config) -> None:
    """The tests run on the environment they set themselves, not on the caller's MLflow, NCCL, Ray or SGLang
    settings (each test that needs one sets it)."""
    for name in [n for n in os.environ if n.startswith(AMBIENT_PREFIXES) and n != "RAY_TMPDIR"]:
        del os.environ[name]


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
    exp = write_experiment(tmp, served_experiment(name="e2e", budget={"trials": 6, "concurrent_trials": 2}))
    wd = tmp / "wd"
    proc = sweep("run", str(exp), "--workdir", str(wd))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return wd, proc
