"""--resume keeps the trial budget the sweep started with (--n-trials included) when sweep.json is
unreadable: the study keeps it too (real Optuna sqlite storage, real MLflow sqlite store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import demo_experiment, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.execute.inline import InlineExecutor
from orchestrator.sweep.driver import Sweep


@pytest.mark.parametrize("damage", [b"", b'{"experiment": "bud', b"\xff\xfe\x00garbage", b"[1, 2]", None])
def test_the_budget_survives_an_unreadable_sweep_json(tmp_path: Path, damage: bytes | None) -> None:
    spec = spec_mod.load(write_experiment(tmp_path, demo_experiment(name="bud")))
    assert spec.budget.trials == 6
    wd = tmp_path / "wd"
    wd.mkdir()  # the driver's lock makes it
    Sweep(spec, wd, executor=InlineExecutor(1), n_trials=2).open()  # `sweep run --n-trials 2`, then killed
    state = wd / "sweep.json"
    if damage is None:
        state.unlink()
        state.mkdir()
    else:
        state.write_bytes(damage)
    assert Sweep(spec, wd, executor=InlineExecutor(1), resume=True).budget_trials == 2
