"""The line `sweep run` prints for each finished trial shows the objective's own metric, the one its
percentage against the baseline is of (issue 22: "9.1 tok/s (-5.7%)" printed decode tok/s beside an
output_tok_s objective's -5.7%, while decode was -15.6%)."""

from __future__ import annotations

import json
import re

from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.cli.running import _progress_printer
from orchestrator.config import experiment as spec_mod
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def test_each_finished_trial_shows_the_objectives_metric(tmp_path, sqlite_store_template, capsys):
    data = demo_experiment(
        name="itl",
        budget={"trials": 4, "concurrent_trials": 2},
        promotion={"max_rounds": 0},
        objective={"metric": "itl_ms_p50", "direction": "minimize", "constraints": {}},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    Sweep(spec, wd, executor=ModelExecutor(2), on_event=_progress_printer(objective="itl_ms_p50")).run()

    shown = {
        int(m.group(1)): float(m.group(2))
        for m in re.finditer(r"✔ trial +(\d+) itl_ms_p50 ([\d.]+)", capsys.readouterr().out)
    }
    measured = {}
    for d in (wd / "trials").iterdir():
        o = json.loads((d / "outcome.json").read_text())
        if o["status"] == "COMPLETE":
            measured[o["number"]] = round(o["metrics"]["itl_ms_p50"], 2)
    assert shown and shown == measured
