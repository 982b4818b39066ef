"""Why nothing is promoted, counted (issue 22, defect 6: a run where only the baseline completed said
"every trial failed"). The real driver on the model-backed executor; every search trial crashes."""

from __future__ import annotations

import yaml
from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.sweep import state as st
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def test_only_the_baseline_measured_says_so_with_the_counts(tmp_path, sqlite_store_template):
    space = tmp_path / "tiny.yaml"
    space.write_text(yaml.safe_dump({"name": "tiny", "params": {"NCCL_PROTO": {"choices": [None, "LL", "Simple"]}}}))
    data = demo_experiment(
        name="nochamp",
        search_space=[str(space)],
        sampler={"kind": "random", "seed": 0},
        simulator={"faults": [{"fault": "crash_after_tokens=1", "when": {"NCCL_PROTO": ["LL", "Simple"]}}]},
        budget={"trials": 3, "concurrent_trials": 1, "max_failure_rate": 1.0},
        promotion={"max_rounds": 0},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    summary = Sweep(spec, wd, executor=ModelExecutor(1)).run()
    assert summary.outcome is st.Outcome.no_champion and summary.complete == 1  # the baseline alone
    assert summary.verdict is not None
    assert "every search trial failed (2 of 2)" in summary.verdict and "every trial failed" not in summary.verdict
