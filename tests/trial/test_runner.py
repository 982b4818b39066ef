"""One trial run directly against the simulator: the experiment travels as its model, the inputs are
written first, the outcome comes back and is kept."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import pytest

from orchestrator.config import experiment as spec_mod
from orchestrator.config.experiment import SweepSpec
from orchestrator.errors import SpecError
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


FAKE_BENCH_SERVING = '''
import argparse, json
ap = argparse.ArgumentParser()
ap.add_argument("--output-file")
ap.add_argument("--num-prompts", type=int)
args, _ = ap.parse_known_args()
row = {"completed": args.num_prompts, "output_throughput": 250.0, "median_tpot_ms": 8.0, "median_ttft_ms": 30.0,
       "p99_ttft_ms": 41.0, "median_itl_ms": 8.0, "p99_itl_ms": 9.5, "accept_length": 2.5, "errors": ["", ""]}
with open(args.output_file, "a") as f:
    f.write(json.dumps(row) + "\\n")
'''


def test_a_trial_measured_by_bench_serving(tmp_path: Path, monkeypatch) -> None:
    """`benchmark.engine: bench_serving` runs `python -m sglang.bench_serving` (here a stand-in that writes
    SGLang's JSONL row) against the server, and its row is the measurement."""
    (tmp_path / "fake" / "sglang").mkdir(parents=True)
    (tmp_path / "fake" / "sglang" / "__init__.py").write_text("")
    (tmp_path / "fake" / "sglang" / "bench_serving.py").write_text(FAKE_BENCH_SERVING)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    s = small_demo()
    s = s.model_copy(update={"benchmark": s.benchmark.model_copy(update={"engine": "bench_serving"})})
    spec = TrialSpec(number=4, params=sp.baseline_params(s.space), trial_dir=str(tmp_path / "0004"), experiment=s)
    outcome = run_trial(spec)
    assert outcome.status is TrialStatus.COMPLETE, (outcome.reason, outcome.log_tail)
    assert outcome.metrics is not None
    assert outcome.metrics.decode_tok_s == 125.0  # 1000 / median_tpot_ms
    assert outcome.metrics.output_tok_s == 250.0 and outcome.metrics.requests_ok == 2
    assert outcome.metrics.sources["decode_tok_s"] == "bench_serving:1000/median_tpot_ms"
    assert (tmp_path / "0004" / "bench_serving-0.jsonl").exists()


def _fake_sglang(tmp_path: Path, monkeypatch, completed: str = "args.num_prompts") -> None:
    (tmp_path / "fake" / "sglang").mkdir(parents=True)
    (tmp_path / "fake" / "sglang" / "__init__.py").write_text("")
    (tmp_path / "fake" / "sglang" / "bench_serving.py").write_text(
        FAKE_BENCH_SERVING.replace('"completed": args.num_prompts', f'"completed": {completed}'))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))


def _bench_serving_demo(**benchmark: object) -> SweepSpec:
    s = small_demo()
    update = {"engine": "bench_serving", "requests": 5, **benchmark}
    return s.model_copy(update={"benchmark": s.benchmark.model_copy(update=update)})


def test_bench_serving_completing_fewer_requests_than_asked_counts_the_rest_as_failed(
        tmp_path: Path, monkeypatch) -> None:
    """SGLang's client writes `completed` below `--num-prompts` when requests fail: the missing ones are
    requests_failed, and, as with the builtin client, the measurement stands with a warning."""
    _fake_sglang(tmp_path, monkeypatch, completed="args.num_prompts - 2")
    s = _bench_serving_demo()
    spec = TrialSpec(number=5, params=sp.baseline_params(s.space), trial_dir=str(tmp_path / "0005"), experiment=s)
    outcome = run_trial(spec)
    assert outcome.status is TrialStatus.COMPLETE, (outcome.reason, outcome.log_tail)
    assert outcome.metrics is not None
    assert (outcome.metrics.requests_ok, outcome.metrics.requests_failed) == (3, 2)
    assert any("2 of 5 requests failed" in w for w in outcome.warnings), outcome.warnings


def test_bench_serving_completing_no_request_fails_the_trial_as_a_bench_error(tmp_path: Path, monkeypatch) -> None:
    _fake_sglang(tmp_path, monkeypatch, completed="0")
    s = _bench_serving_demo()
    spec = TrialSpec(number=6, params=sp.baseline_params(s.space), trial_dir=str(tmp_path / "0006"), experiment=s)
    outcome = run_trial(spec)
    assert outcome.status is TrialStatus.FAILED
    assert outcome.failure_kind == "bench_error" and "all 5 requests failed" in (outcome.reason or "")


def test_bench_serving_runs_under_benchmark_client_python(tmp_path: Path, monkeypatch) -> None:
    """`benchmark.client_python` is the interpreter that runs `-m sglang.bench_serving`, not the server's."""
    _fake_sglang(tmp_path, monkeypatch)
    record = tmp_path / "client-python-ran"
    recorder = tmp_path / "client-python"
    recorder.write_text(f'#!/bin/sh\necho "$@" > "{record}"\nexec "{sys.executable}" "$@"\n')
    recorder.chmod(0o755)
    s = _bench_serving_demo(client_python=str(recorder))
    spec = TrialSpec(number=7, params=sp.baseline_params(s.space), trial_dir=str(tmp_path / "0007"), experiment=s)
    outcome = run_trial(spec)
    assert outcome.status is TrialStatus.COMPLETE, (outcome.reason, outcome.log_tail)
    assert record.read_text().startswith("-m sglang.bench_serving ")
    assert outcome.metrics is not None and outcome.metrics.requests_failed == 0


def test_benchmark_client_python_refuses_control_characters(tmp_path: Path) -> None:
    text = DEMO.read_text()
    assert "\nbenchmark:\n" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("\nbenchmark:\n", '\nbenchmark:\n  client_python: "/usr/bin/py\\nthon"\n', 1))
    with pytest.raises(SpecError, match="client_python"):
        spec_mod.load(bad)
