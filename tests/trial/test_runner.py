"""One trial run directly against the simulator: the experiment travels as its model, the inputs are
written first, the outcome comes back and is kept."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from orchestrator.config import experiment as spec_mod
from orchestrator.config.experiment import SweepSpec
from orchestrator.records import TrialSpec, TrialStatus
from orchestrator.search import space as sp
from orchestrator.trial.runner import run_trial

DEMO = Path(__file__).resolve().parents[2] / "experiments" / "demo.yaml"


def small_demo() -> SweepSpec:
    s = spec_mod.load(DEMO)
    return s.model_copy(update={
        "server": s.server.model_copy(update={"tp": 2}),
        "benchmark": s.benchmark.model_copy(update={"requests": 2, "output_len": 16}),
    })


def test_trial_spec_carries_the_experiment_model_through_pickle(tmp_path: Path) -> None:
    s = small_demo()
    spec = TrialSpec(number=1, params=sp.baseline_params(s.space), trial_dir=str(tmp_path), experiment=s)
    again = pickle.loads(pickle.dumps(spec))
    assert again.experiment == s and isinstance(again.experiment, SweepSpec)


def test_a_trial_on_the_simulator(tmp_path: Path) -> None:
    s = small_demo()
    params = {**sp.baseline_params(s.space), "NCCL_PROTO": "LL", "all_reduce_path": "nccl"}
    spec = TrialSpec(number=3, params=params, trial_dir=str(tmp_path / "0003"), experiment=s)
    outcome = run_trial(spec, gpu_ids=["0", "1"], node="n1")
    assert outcome.status is TrialStatus.COMPLETE, (outcome.reason, outcome.log_tail)
    assert outcome.metrics is not None and outcome.metrics.decode_tok_s > 0
    assert outcome.allreduce_path == "nccl"  # from the plan's flags (--disable-custom-all-reduce)
    assert outcome.launch is not None and outcome.launch.flags["--disable-custom-all-reduce"] is True
    assert set(outcome.timings) == {"server_start", "observe", "bench", "shutdown"}
    folder = tmp_path / "0003"
    written = json.loads((folder / "spec.json").read_text())
    assert written == {"number": 3, "role": "search", "params": params, "repeats": 1, "seed": 0, "node": "n1",
                       "gpu_ids": ["0", "1"]}
    assert json.loads((folder / "outcome.json").read_text()) == outcome.model_dump(mode="json")
    launch = json.loads((folder / "launch.json").read_text())
    assert launch["env"]["NCCL_PROTO"] == "LL" and launch["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
