"""`sweep probe`, `sweep export --format nccl-tuner` and `sweep plan`'s cost lines, as a user runs them
(the CLI as a process, the simulated engine, a real MLflow sqlite store)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from probe_helpers import REPO, write_spec

from orchestrator.probe import read_probe
from orchestrator.probe.tuner import ALGORITHMS, COLLECTIVES, PROTOCOLS, SIZE_MAX, parse_tuner_config

SWEEP = [sys.executable, "-m", "orchestrator.cli"]


def sweep(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*SWEEP, *args], cwd=cwd, capture_output=True, text=True, timeout=1500)  # a hang guard


def test_probe_ranks_writes_probe_json_and_an_mlflow_run_then_exports_tuner_rules(tmp_path):
    write_spec(tmp_path)
    wd = tmp_path / "wd"
    got = sweep("probe", "exp.yaml", "--workdir", str(wd), "--top", "5", "--keep-within", "1.1", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    text = got.stdout
    for column in ("rank", "us", "x best", "kept", "setting"):
        assert column in text
    assert "within 1.1x of the best" in text and "MLflow run" in text
    assert "all_reduce_backend=pcie_ipc: " in text and "x the fastest (rank " in text  # issue 19: backends beside
    result = read_probe(wd / "probe.json")
    assert result.host == "pcie-rtxpro6000-x8" and len(result.settings) == 48

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("probe-test").experiment_id])
    assert run.data.tags["sweep.kind"] == "probe" and run.data.metrics["settings_probed"] == 48
    assert run.data.metrics["best_verify_us"] < run.data.metrics["defaults_verify_us"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"probe_ranking.json", "probe.json", "probe_latency.png"} <= artifacts

    rules_file = tmp_path / "rules.csv"
    got = sweep("export", "--format", "nccl-tuner", "-o", str(rules_file), "--workdir", str(wd), cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    rules = parse_tuner_config(rules_file.read_text())
    assert rules
    for rule in rules:  # every field of every rule, as NCCL's example plugin reads it
        assert rule.collective in COLLECTIVES and rule.algorithm in ALGORITHMS and rule.protocol in PROTOCOLS
        assert rule.channels >= 1 and rule.n_nodes == 1 and rule.n_ranks == 8
        assert 0 <= rule.min_bytes <= rule.max_bytes <= SIZE_MAX
    for collective in COLLECTIVES:  # a catch-all per collective, last of its rules
        last = [r for r in rules if r.collective == collective][-1]
        assert (last.min_bytes, last.max_bytes) == (0, SIZE_MAX)
    small = next(r for r in rules if r.collective == "allreduce")
    assert small.min_bytes == 0 and small.protocol == "ll"  # the probe's winner at decode sizes


def test_bad_input_gets_one_message(tmp_path):
    write_spec(tmp_path)
    got = sweep("probe", "exp.yaml", "--workdir", str(tmp_path / "wd"), "--keep-within", "0.5", cwd=tmp_path)
    assert got.returncode == 2 and "--keep-within" in got.stderr and "Traceback" not in got.stderr
    got = sweep("export", "--format", "nccl-tuner", "-o", "r.csv", "--workdir", str(tmp_path / "none"), cwd=tmp_path)
    assert got.returncode == 2 and "sweep probe" in got.stderr and "Traceback" not in got.stderr
    write_spec(tmp_path, space={"speculative_algorithm": {"choices": [None, "EAGLE3"]}})
    got = sweep("probe", "exp.yaml", "--workdir", str(tmp_path / "wd"), cwd=tmp_path)
    assert got.returncode == 2 and "no NCCL variable" in got.stderr and "Traceback" not in got.stderr


def test_plan_prints_one_trials_gpu_time_and_how_many_fit(tmp_path):
    got = sweep("plan", str(REPO / "experiments" / "demo.yaml"), "--limit", "1", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    # One trial's minutes as the night spends them (the simulator sleeps the load), with the real host's load.
    assert "one trial: " in got.stdout and "a real host loads this model in 330 s" in got.stdout
    assert "budget.trials 20 ends the search" in got.stdout
    kimi = sweep("plan", str(REPO / "experiments" / "kimi-k2.5-tp8.yaml"), "--limit", "1", cwd=tmp_path)
    # The shipped real-host experiment names the model profile its schedule is planned with, and fits 8 h.
    assert kimi.returncode == 0 and "model profile kimi-k2.5" in kimi.stdout
    night = next(line for line in kimi.stdout.splitlines() if line.startswith("night: "))
    assert night.startswith("night: 8.00 h = probe") and "does not fit" not in kimi.stdout
    unnamed = tmp_path / "unnamed.yaml"
    data = yaml.safe_load((REPO / "experiments" / "kimi-k2.5-tp8.yaml").read_text())
    data.pop("simulator")
    data["search_space"] = [str(REPO / "search_spaces" / "nccl.yaml"), str(REPO / "search_spaces" / "eagle3.yaml")]
    unnamed.write_text(yaml.safe_dump(data))
    blind = sweep("plan", str(unnamed), "--limit", "1", cwd=tmp_path)
    assert blind.returncode == 0 and "unknown: name a model profile" in blind.stdout
    json.loads(sweep("plan", str(REPO / "experiments" / "demo.yaml"), "--json", "--limit", "1", cwd=tmp_path).stdout)


def test_probe_and_time_scale_settings_are_checked_and_reach_the_launch(tmp_path):
    import pytest

    from orchestrator.errors import SpecError
    from orchestrator.trial import plan

    with pytest.raises(SpecError) as bad:
        write_spec(tmp_path, probe={"keep_within": 0.5, "budgt": 3}, simulator={"time_scale": 2})
    text = str(bad.value)
    assert "probe.keep_within: must be >= 1.0" in text and "did you mean 'budget'" in text
    assert "simulator.time_scale: must be <= 1.0" in text
    spec = write_spec(tmp_path, probe={"enabled": True}, simulator={"time_scale": 0.01})
    assert spec.probe.enabled and spec.probe.keep_within == 1.2 and spec.probe.budget is None
    argv = plan.make(spec, {}, port=31000).argv
    assert argv[argv.index("--sim-time-scale") + 1] == "0.01"
    assert "--sim-time-scale" not in plan.make(write_spec(tmp_path), {}, port=31000).argv
