"""The promoted champion names the all-reduce backend its trial's server recorded, in summary.json and in
champion.env's header, never a guess (issue 19): in-process, the model-backed executor, real Optuna and
MLflow sqlite stores."""

from __future__ import annotations

import json

import yaml
from e2e_helpers import demo_experiment
from loop_helpers import run_sweep
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.execute.inline import InlineExecutor
from orchestrator.probe.result import ProbeResult, write_probe
from orchestrator.sweep import publish


def test_summary_and_champion_env_name_the_recorded_backend(tmp_path, sqlite_store_template):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"name": "comm", "params": {"NCCL_P2P_LEVEL": {"choices": [None, "SYS"]}}}))
    data = demo_experiment(
        name="backend-named",
        budget={"trials": 2, "concurrent_trials": 1},
        sampler={"kind": "grid", "seed": 0},
        promotion={"max_rounds": 0},
    )
    data["search_space"] = [str(space)]
    wd, summary, _, _ = run_sweep(tmp_path, sqlite_store_template, data)
    assert summary.promoted and summary.champion is not None
    number = summary.champion["number"]
    (outcome,) = [
        json.loads(p.read_text())
        for p in (wd / "trials").glob("*/outcome.json")
        if json.loads(p.read_text())["number"] == number
    ]
    recorded = outcome["allreduce_path"]
    assert recorded  # the executor recorded one (nccl on the demo's 8-GPU PCIe profile)
    assert summary.champion["allreduce_backend"] == recorded
    header = [line for line in (wd / "champion.env").read_text().splitlines() if line.startswith("#")]
    assert f"# all-reduce backend: {recorded} (decode/verify, as trial {number}'s server recorded it)" in header


def test_the_report_warns_when_the_probe_measured_another_nccl(tmp_path, sqlite_store_template):
    """Real simulator servers (inline executor) print NCCL's `NCCL version 2.28.9+cuda13.0` line per rank (the
    pcie profile's NCCL), the trials' fingerprints record it; a probe.json measured with NCCL 2.30.7 is named
    in the report beside the fingerprint changes (issue 19)."""
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"name": "comm", "params": {"NCCL_P2P_LEVEL": {"choices": [None, "SYS"]}}}))
    data = demo_experiment(
        name="nccl-versions",
        budget={"trials": 2, "concurrent_trials": 1},
        sampler={"kind": "grid", "seed": 0},
        promotion={"max_rounds": 0},
    )
    data["search_space"] = [str(space)]
    wd, _, _, _ = run_sweep(tmp_path, sqlite_store_template, data, inner=InlineExecutor(1))
    outcomes = [json.loads(p.read_text()) for p in (wd / "trials").glob("*/outcome.json")]
    assert {o["fingerprint"].get("nccl") for o in outcomes} == {"2.28.9+cuda13.0"}
    assert not any("measured NCCL" in c for c in publish.build(wd).content.fingerprint_changes)  # no probe.json
    write_probe(
        ProbeResult(
            experiment="nccl-versions",
            engine="simulator",
            host="pcie-rtxpro6000-x8",
            tp=8,
            nccl_version="2.30.7+cuda13.0",
            sizes=(),
            settings=(),
            rows=(),
            space_settings=0,
            searched=False,
            seconds=0.0,
        ),
        wd / "probe.json",
    )
    changes = publish.build(wd).content.fingerprint_changes
    assert any(
        c.startswith("probe.json measured NCCL 2.30.7 but trial ")
        and c.endswith("probe again")
        and "loaded NCCL 2.28.9" in c
        for c in changes
    ), changes
