"""The correctness gate (issue 21 item 3): a configuration that changes the outputs is never promoted.

The real driver on the model-backed executor, which answers the confirmation's output capture with the
simulator's own token function (simulator/tokens.py): forcing NCCL_PROTO=LL128 on the PCIe host is the
fastest setting at 32 streams there, and a modelled silent corruption (after NCCL's documentation of
NCCL_PROTO, not a measurement); the gate refuses it with its figure, where without the gate it is promoted.
These nights turn the search's correctness screen off (promotion.correctness.screen: false), which would
otherwise keep the corrupting setting from being the champion at all (tests/sweep/test_correctness_screen.py).
"""

from __future__ import annotations

import json
import re

import yaml
from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.sweep import state as st
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def _night(tmp_path, sqlite_store_template, name: str, protos: list, concurrency: int, **promotion):
    promotion.setdefault("correctness", {"screen": False})
    space = tmp_path / f"{name}.yaml"
    space.write_text(yaml.safe_dump({"name": name, "params": {"NCCL_PROTO": {"choices": protos}}}))
    data = demo_experiment(
        name=name,
        search_space=[str(space)],
        sampler={"kind": "grid", "seed": 0},
        simulator={"noise": 0.002},
        benchmark={"concurrency": concurrency},
        objective={"concurrency": concurrency, "constraints": {}},
        budget={"trials": len(protos) + 1, "concurrent_trials": 1},
        promotion={"min_rounds": 3, "max_rounds": 8, "min_gain": 0.0, **promotion},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / name
    copy_store(sqlite_store_template, wd)
    return Sweep(spec, wd, executor=ModelExecutor(2)).run(), wd


def test_forced_ll128_on_pcie_is_refused_by_the_correctness_gate_with_its_figure(tmp_path, sqlite_store_template):
    summary, wd = _night(tmp_path, sqlite_store_template, "ll128", [None, "LL128"], 32)
    assert summary.outcome is st.Outcome.outputs_changed and not summary.promoted
    assert summary.champion is not None and summary.champion["params"] == {"NCCL_PROTO": "LL128"}
    verdict = summary.verdict or ""
    # faster (the speed gate passed) ...
    assert "Speed: promoted" in verdict
    # ... but refused, naming the check and its figure
    assert "correctness gate (the baseline's logprob score): REFUSED: outputs differ from the baseline's on" in verdict
    assert re.search(
        r"on [1-8] of 8 prompts \(first at token \d+\); the baseline's server scores token \d+ of "
        r"prompt \d \d+\.\d\d nats below its own top choice \(tolerance 0\.5 nats\)",
        verdict,
    ), verdict
    kept = json.loads((wd / "confirm" / "correctness.json").read_text())["champion"]
    assert kept["passed"] is False and kept["worst_nats"] > 0.5 and kept["differing"] >= 1
    assert not (wd / "champion.env").exists()
    # what the gate read: both sides' outputs from round one, the baseline's scores from round two
    champion = json.loads((wd / "confirm" / "00-champion" / "outputs.json").read_text())
    baseline = json.loads((wd / "confirm" / "00-baseline" / "outputs.json").read_text())
    assert len(champion["prompts"]) == len(baseline["prompts"]) == 8
    assert all(len(p["output_ids"]) == 256 for p in champion["prompts"])
    scores = json.loads((wd / "confirm" / "01-baseline" / "outputs.json").read_text())
    assert {s["arm"] for s in scores["scored"]} == {"champion"} and len(scores["scored"]) == kept["differing"]


def test_a_resume_after_the_refusal_measures_nothing_again(tmp_path, sqlite_store_template):
    """outputs_changed is a final verdict (sweep/_decided.py _final): a --resume neither confirms nor captures
    again, and still promotes nothing."""
    summary, wd = _night(tmp_path, sqlite_store_template, "ll128again", [None, "LL128"], 32)
    assert summary.outcome is st.Outcome.outputs_changed
    spec = spec_mod.load(tmp_path / "exp.yaml")
    again = ModelExecutor(2)
    resumed = Sweep(spec, wd, executor=again, resume=True).run()
    assert resumed.outcome is st.Outcome.outputs_changed and not resumed.promoted
    assert "already decided before this --resume" in (resumed.verdict or "")
    assert again.launched == 0
    assert not (wd / "champion.env").exists()


def test_without_the_gate_the_same_night_promotes_the_corrupting_setting(tmp_path, sqlite_store_template):
    summary, wd = _night(
        tmp_path,
        sqlite_store_template,
        "ll128off",
        [None, "LL128"],
        32,
        correctness={"enabled": False, "screen": False},
    )
    assert summary.outcome is st.Outcome.promoted and (wd / "champion.env").exists()
    assert "NCCL_PROTO=LL128" in (wd / "champion.env").read_text()
    assert not (wd / "confirm" / "00-champion" / "outputs.json").exists()  # nothing captured when off


def test_a_refused_champion_gives_way_to_the_runner_up_that_passes_both_gates(tmp_path, sqlite_store_template):
    """NCCL_PROTO=LL128 is the fastest at 32 streams on the PCIe profile, and corrupts; the runner-up from
    another region (2 channels at most, NCCL's own protocol: +0.95% in the model) is faster than the baseline
    and decodes as it does."""
    space = tmp_path / "fallback.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "name": "fallback",
                "params": {
                    "NCCL_PROTO": {"choices": [None, "LL128"]},
                    "NCCL_MAX_NCHANNELS": {"choices": [None, 2]},
                    "NCCL_ALGO": {"choices": [None, "Tree"]},
                },
            }
        )
    )
    data = demo_experiment(
        name="fallback",
        search_space=[str(space)],
        sampler={"kind": "grid", "seed": 0},
        simulator={"noise": 0.0005},
        benchmark={"concurrency": 32},
        objective={"concurrency": 32, "constraints": {}},
        budget={"trials": 8, "concurrent_trials": 2},
        promotion={
            "min_rounds": 3,
            "max_rounds": 8,
            "min_gain": 0.0,
            "explain": True,
            "correctness": {"screen": False},
        },
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "fallback"
    copy_store(sqlite_store_template, wd)
    summary = Sweep(spec, wd, executor=ModelExecutor(2)).run()
    verdict = summary.verdict or ""
    kept = json.loads((wd / "confirm" / "correctness.json").read_text())
    assert summary.champion is not None and summary.champion["params"] == {"NCCL_PROTO": "LL128"}
    assert kept["champion"]["passed"] is False
    assert summary.outcome is st.Outcome.promoted, verdict
    assert summary.promoted_config == "runner_up" and kept["runner_up"]["passed"] is True, kept
    assert re.search(
        r"promoted trial \d+ \(the runner-up\) instead of trial \d+, which changes the outputs "
        r"\(champion: correctness gate \(the baseline's logprob score\): REFUSED: outputs differ",
        verdict,
    ), verdict
    assert verdict.endswith(
        "correctness gate (equal token streams): passed: 8 of 8 prompts decode to the baseline's "
        "256 tokens, token for token"
    )
    env = (wd / "champion.env").read_text()
    assert "NCCL_MAX_NCHANNELS=2" in env and "NCCL_PROTO=LL128" not in env
