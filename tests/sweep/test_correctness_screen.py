"""The search's correctness screen (issue 20, the 32-stream world): a search trial whose greedy outputs
changed is measured but never the champion, so the confirmation spends its rounds on a configuration it
can promote.

The real driver on the model-backed executor (real Optuna and MLflow sqlite stores), PCIe profile at 32
streams, where forcing NCCL_PROTO=LL128 is the fastest setting and a MODELLED silent corruption (after
NCCL's documentation of NCCL_PROTO, not a measurement; simulator/tokens.py). The first baseline captures
its outputs with its 5 best tokens per position (SGLang's top_logprobs_num), every search trial its
outputs; sweep/_screen.py refuses the LL128 trials on their first differing token.
"""

from __future__ import annotations

import json

import mlflow
import optuna
import pandas as pd
import pytest
import yaml
from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.search.sampler import OUTPUTS_CHANGED_ATTR
from orchestrator.sweep import state as st
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def _run(tmp_path, template, name: str, **correctness):  # type: ignore[no-untyped-def]
    space = tmp_path / f"{name}-space.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "params": {
                    "NCCL_PROTO": {"choices": [None, "LL128"]},
                    "NCCL_MAX_NCHANNELS": {"choices": [None, 2]},
                    "NCCL_ALGO": {"choices": [None, "Tree"]},
                },
            }
        )
    )
    data = demo_experiment(
        name=name,
        search_space=[str(space)],
        sampler={"kind": "grid", "seed": 0},
        simulator={"noise": 0.0005},
        benchmark={"concurrency": 32},
        objective={"concurrency": 32, "constraints": {}},
        budget={"trials": 8, "concurrent_trials": 2},
        promotion={"min_rounds": 3, "max_rounds": 8, "min_gain": 0.0, "correctness": correctness},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data, name=f"{name}.yaml"))
    wd = tmp_path / name
    copy_store(template, wd)
    return Sweep(spec, wd, executor=ModelExecutor(2)).run(), wd


def _outcomes(wd) -> dict[int, dict]:  # type: ignore[no-untyped-def]
    return {int(p.parent.name): json.loads(p.read_text()) for p in (wd / "trials").glob("*/outcome.json")}


def test_trials_whose_outputs_changed_are_measured_but_never_the_champion(tmp_path, sqlite_store_template):
    summary, wd = _run(tmp_path, sqlite_store_template, "screen")
    outcomes = _outcomes(wd)
    ll128 = {n: o for n, o in outcomes.items() if o["params"].get("NCCL_PROTO") == "LL128"}
    others = {n: o for n, o in outcomes.items() if n not in ll128 and o["role"] == "search"}
    # Two at a time: the LL128 trials launched before the first refusal came back; the screen's refusal then
    # marks LL128 as a region the sampler does not launch again (search/regions.py), so the rest of the grid's
    # LL128 points are settled without a launch, each saying why.
    assert 1 <= len(ll128) < 4 and others
    storage = f"sqlite:///{wd / 'optuna.db'}"
    (name,) = optuna.get_all_study_names(storage)
    settled = [
        t
        for t in optuna.load_study(study_name=name, storage=storage).trials
        if t.user_attrs.get("skipped") and t.params.get("NCCL_PROTO") == "LL128"
    ]
    assert len(ll128) + len(settled) == 4, (sorted(ll128), [t.user_attrs for t in settled])
    assert all("changed the outputs" in str(t.user_attrs.get("reason")) for t in settled)
    # every LL128 trial measured (its numbers kept) and refused with its figure; no other trial refused
    for o in ll128.values():
        assert o["status"] == "COMPLETE" and o["metrics"]["decode_tok_s"] > 0
        assert o["outputs_changed"].startswith("outputs differ from the baseline's on "), o["outputs_changed"]
        assert (
            "below its own top choice there (tolerance 0.5 nats): the configuration changes the outputs"
            in o["outputs_changed"]
        )
    assert not any(o["outputs_changed"] for o in others.values())
    # ... though they measured fastest: the pick went to the best trial the screen kept
    fastest = max(outcomes.values(), key=lambda o: o["metrics"]["decode_tok_s"] if o["role"] == "search" else 0)
    assert fastest["params"]["NCCL_PROTO"] == "LL128"
    assert summary.champion is not None and summary.champion["params"].get("NCCL_PROTO") is None
    assert summary.champion["number"] == max(others, key=lambda n: others[n]["metrics"]["decode_tok_s"])
    # the gate then promotes what it can deploy (or finds it not better); never an LL128 configuration
    assert summary.outcome in (st.Outcome.promoted, st.Outcome.not_better), summary.verdict
    if summary.promoted:
        assert "NCCL_PROTO=LL128" not in (wd / "champion.env").read_text()
        assert "correctness gate" in (summary.verdict or "") and "REFUSED" not in (summary.verdict or "")
    # the reference: the first baseline's capture kept its 5 best tokens at every position
    base = json.loads((wd / "trials" / "0000" / "outputs.json").read_text())
    assert all(len(p["output_top"]) == 256 and all(len(t) == 5 for t in p["output_top"]) for p in base["prompts"])
    assert all(json.loads((wd / "trials" / f"{n:04d}" / "outputs.json").read_text())["prompts"] for n in others)
    # the study (the sampler reads it) and MLflow (a user browsing the night) say the same
    storage = f"sqlite:///{wd / 'optuna.db'}"
    (name,) = optuna.get_all_study_names(storage)
    study = optuna.load_study(study_name=name, storage=storage)
    marked = {t.number for t in study.trials if t.user_attrs.get(OUTPUTS_CHANGED_ATTR)}
    assert marked == set(ll128)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "tags.`sweep.outputs_changed` != ''"
    )
    assert {int(r.data.tags["sweep.trial_number"]) for r in runs} >= set(ll128)
    assert all("decode_tok_s" in r.data.metrics for r in runs)  # nothing measured is lost
    parent = next(
        r
        for e in client.search_experiments()
        for r in client.search_runs([e.experiment_id])
        if r.data.tags.get("sweep.kind") == "sweep"
    )
    table = pd.read_csv(client.download_artifacts(parent.info.run_id, "results.csv", str(tmp_path)))
    refused = table[table["outputs_changed"].fillna("") != ""]
    assert set(refused["trial"]) == set(ll128)
    assert table["best_so_far"].max() == pytest.approx(max(o["metrics"]["decode_tok_s"] for o in others.values()))
    log = (wd / "sweep.log").read_text()
    assert "correctness screen (first differing tokens against the baseline's top choices): REFUSED" in log
    assert "measured, but never a candidate" in log


def test_with_the_screen_off_the_corrupting_setting_is_the_champion_again(tmp_path, sqlite_store_template):
    summary, wd = _run(tmp_path, sqlite_store_template, "noscreen", screen=False)
    assert summary.champion is not None and summary.champion["params"].get("NCCL_PROTO") == "LL128"
    assert not any(o.get("outputs_changed") for o in _outcomes(wd).values())
    assert not (wd / "trials" / "0001" / "outputs.json").exists()  # nothing captured in the search
