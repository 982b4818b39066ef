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
from orchestrator.trial import clients
from orchestrator.trial.runner import run_trial

DEMO = Path(__file__).resolve().parents[2] / "experiments" / "demo.yaml"


def small_demo() -> SweepSpec:
    s = spec_mod.load(DEMO)
    return s.model_copy(
        update={
            "server": s.server.model_copy(update={"tp": 2}),
            "benchmark": s.benchmark.model_copy(update={"requests": 2, "output_len": 16}),
        }
    )


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
    assert written == {
        "number": 3,
        "role": "search",
        "params": params,
        "repeats": 1,
        "seed": 0,
        "node": "n1",
        "gpu_ids": ["0", "1"],
    }
    assert json.loads((folder / "outcome.json").read_text()) == outcome.model_dump(mode="json")
    launch = json.loads((folder / "launch.json").read_text())
    assert launch["env"]["NCCL_PROTO"] == "LL" and launch["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"


FAKE_BENCH_SERVING = """
import argparse, json
ap = argparse.ArgumentParser()
ap.add_argument("--output-file")
ap.add_argument("--num-prompts", type=int)
args, _ = ap.parse_known_args()
row = {"completed": args.num_prompts, "output_throughput": 250.0, "median_tpot_ms": 8.0, "median_ttft_ms": 30.0,
       "p99_ttft_ms": 41.0, "median_itl_ms": 8.0, "p99_itl_ms": 9.5, "accept_length": 2.5, "errors": ["", ""]}
with open(args.output_file, "a") as f:
    f.write(json.dumps(row) + "\\n")
"""


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
        FAKE_BENCH_SERVING.replace('"completed": args.num_prompts', f'"completed": {completed}')
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))


def _bench_serving_demo(**benchmark: object) -> SweepSpec:
    s = small_demo()
    update = {"engine": "bench_serving", "requests": 5, **benchmark}
    return s.model_copy(update={"benchmark": s.benchmark.model_copy(update=update)})


def test_bench_serving_completing_fewer_requests_than_asked_counts_the_rest_as_failed(
    tmp_path: Path, monkeypatch
) -> None:
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
    ran = record.read_text()
    assert ran.startswith(f"{Path(clients.__file__).with_name('_bench_serving_repeats.py')} ")
    assert '"module": "sglang.bench_serving"' in ran
    assert outcome.metrics is not None and outcome.metrics.requests_failed == 0


def test_bench_serving_pays_sglangs_import_once_per_trial_not_per_repeat(tmp_path: Path, monkeypatch) -> None:
    """Importing SGLang takes minutes on a small machine and tens of seconds on a GPU host: the three
    repeats of a trial run in one bench_serving process, each with its own JSONL row and /metrics window."""
    _fake_sglang(tmp_path, monkeypatch)
    imports = tmp_path / "sglang-imported"
    (tmp_path / "fake" / "sglang" / "__init__.py").write_text(
        f"with open({str(imports)!r}, 'a') as f:\n    f.write('imported\\n')\n"
    )
    s = _bench_serving_demo()
    spec = TrialSpec(
        number=10, params=sp.baseline_params(s.space), trial_dir=str(tmp_path / "0010"), experiment=s, repeats=3
    )
    outcome = run_trial(spec)
    assert outcome.status is TrialStatus.COMPLETE, (outcome.reason, outcome.log_tail)
    assert imports.read_text() == "imported\n"  # one process, one import, three runs
    assert len(outcome.repeats) == 3 and all(m.output_tok_s == 250.0 for m in outcome.repeats)
    folder = tmp_path / "0010"
    for r in range(3):
        assert len((folder / f"bench_serving-{r}.jsonl").read_text().splitlines()) == 1
        assert "sglang:" in (folder / f"bench_serving-{r}.metrics-after.txt").read_text()  # the simulator's /metrics
    assert (folder / "bench_serving.log").read_text().count("=== repeat ") == 3


def test_benchmark_client_python_refuses_control_characters(tmp_path: Path) -> None:
    text = DEMO.read_text()
    assert "\nbenchmark:\n" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("\nbenchmark:\n", '\nbenchmark:\n  client_python: "/usr/bin/py\\nthon"\n', 1))
    with pytest.raises(SpecError, match="client_python"):
        spec_mod.load(bad)


# --- a trial that loads an nccl-tuner rule file ---------------------------------------------------

RULES = """\
# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks
allreduce,0,65536,ring,ll,2,1,2
allreduce,0,18446744073709551615,ring,simple,4,1,2
"""


def _tuner_demo(tmp_path: Path, plugin: Path) -> SweepSpec:
    """The small demo whose server.env loads `plugin` with a rule file, validated as a user's YAML is."""
    rules = tmp_path / "nccl-tuner.csv"
    rules.write_text(RULES)
    s = small_demo()
    env = {
        **s.server.env,
        "NCCL_TUNER_PLUGIN": str(plugin),
        "NCCL_TUNER_CONFIG_FILE": str(rules),
        "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING",
    }
    server = type(s.server).model_validate({**s.server.model_dump(), "env": env})
    return s.model_copy(update={"server": server})


def test_a_trial_that_loads_a_tuner_rule_file_is_proven_on_every_rank(tmp_path: Path) -> None:
    plugin = tmp_path / "libnccl-tuner-example.so"
    plugin.write_bytes(b"\x7fELF")  # the simulated NCCL loads a file named *tuner* as ext-tuner/example
    s = _tuner_demo(tmp_path, plugin)
    params = {**sp.baseline_params(s.space), "all_reduce_path": "nccl"}
    spec = TrialSpec(number=8, params=params, trial_dir=str(tmp_path / "0008"), experiment=s)
    outcome = run_trial(spec)
    assert outcome.status is TrialStatus.COMPLETE, (outcome.reason, outcome.log_tail)
    log = (tmp_path / "0008" / "server.log").read_text()
    assert log.count("NCCL INFO TUNER/Plugin: Using Example (v5)") == 2
    assert log.count("TUNER/ExamplePlugin: Loaded 2 tuning configurations from") == 2
    # NCCL 2.28.9's lines, as a real H200 printed them (docs/measurements/h200-tuner-plugin/)
    assert log.count(f"NCCL INFO NCCL_TUNER_PLUGIN set by environment to {plugin}\n") == 2
    assert log.count(f"NCCL INFO Successfully loaded external tuner plugin {plugin}\n") == 2
    # the simulated NCCL follows the rules: every all-reduce it logs is RING with the rule's protocol/channels
    tuning = [line.split("NCCL INFO ", 1)[1] for line in log.splitlines() if "Bytes -> Algo" in line]
    assert tuning and all(("proto LL channel{Lo..Hi}={0..1}" in t) == (int(t.split()[1]) <= 65536) for t in tuning)


def test_a_tuner_plugin_that_does_not_load_is_env_not_applied_naming_the_rank_and_why(tmp_path: Path) -> None:
    missing = tmp_path / "no-such" / "libnccl-tuner-example.so"
    s = _tuner_demo(tmp_path, missing)
    spec = TrialSpec(number=9, params=sp.baseline_params(s.space), trial_dir=str(tmp_path / "0009"), experiment=s)
    outcome = run_trial(spec)
    assert outcome.status is TrialStatus.FAILED and outcome.failure_kind == "env_not_applied", outcome.reason
    for device in (0, 1):
        assert (
            f"NCCL_TUNER_PLUGIN={missing} was not loaded on device {device}: NCCL could not open {missing} and "
            f"used its internal tuner"
        ) in (outcome.reason or "")


# --- a server that crashes: the simulator ends as SGLang 0.5.23 does, the exception is the reason ----------------


def _crashing_demo(fault: str) -> SweepSpec:
    s = small_demo()
    return s.model_copy(update={"simulator": s.simulator.model_copy(update={"faults": (fault,)})})


def test_a_crash_mid_benchmark_is_reported_with_the_exception_not_the_signal(tmp_path: Path) -> None:
    """SGLang's launcher SIGKILLs its own process tree when a scheduler fails
    (sglang/srt/entrypoints/engine.py::launch_phase_sigquit_handler -> srt/utils/common.py::kill_process_tree),
    so every crash ends as 'killed by signal 9'; the simulator does the same, and the reason is the
    exception the scheduler printed."""
    s = _crashing_demo("crash_after_tokens=5")
    spec = TrialSpec(number=11, params=sp.baseline_params(s.space), trial_dir=str(tmp_path / "0011"), experiment=s)
    outcome = run_trial(spec)
    assert outcome.status is TrialStatus.FAILED and outcome.failure_kind == "server_crash", outcome.reason
    assert outcome.reason.startswith(
        "server died: RuntimeError: CUDA error: an illegal memory access was "
        "encountered (killed by signal 9 (SIGKILL)) during the benchmark"
    ), outcome.reason
    log = (tmp_path / "0011" / "server.log").read_text()
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "kill_process_tree called:" in log


def test_a_start_up_crash_names_sglangs_exception(tmp_path: Path) -> None:
    """More TP ranks than GPUs: the rank without a GPU fails in set_device, the launcher kills its tree."""
    s = small_demo()
    s = s.model_copy(update={"server": s.server.model_copy(update={"tp": 16})})
    spec = TrialSpec(number=12, params=sp.baseline_params(s.space), trial_dir=str(tmp_path / "0012"), experiment=s)
    outcome = run_trial(spec)
    assert outcome.status is TrialStatus.FAILED and outcome.failure_kind == "server_crash", outcome.reason
    assert outcome.reason == (
        "server died: torch.AcceleratorError: CUDA error: invalid device ordinal "
        "(tp_size=16, 8 GPUs visible) (killed by signal 9 (SIGKILL))"
    ), outcome.reason
