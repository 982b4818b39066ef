"""A two-stage sweep in-process (the real driver on the model-backed executor, the simulated probe,
real Optuna and MLflow sqlite stores): stage one probes the NCCL settings, stage two measures only
the kept ones, warm-started; the probe's time counts on the sweep's clock."""

from __future__ import annotations

import json

from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.probe import rank_settings, read_probe
from orchestrator.results import cost as cost_mod
from orchestrator.search.study import read_only
from orchestrator.sweep import state as st
from orchestrator.sweep._probe_stage import warm_start_size
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def test_stage_two_measures_only_kept_nccl_settings_and_resume_reuses_the_probe(tmp_path, sqlite_store_template):
    data = demo_experiment(
        name="twostage",
        budget={"trials": 15, "concurrent_trials": 2},
        promotion={"max_rounds": 0},
        probe={"enabled": True, "keep_within": 1.1},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    events: list = []
    summary = Sweep(spec, wd, executor=ModelExecutor(2), on_event=events.append).run()
    (stage,) = [e for e in events if isinstance(e, st.ProbeStage)]  # what the terminal shows of stage one
    assert "48 NCCL settings probed" in stage.text and "kept" in stage.text

    probe = read_probe(wd / "probe.json")
    assert probe.host == "pcie-rtxpro6000-x8" and len(probe.settings) == 48
    ranked = rank_settings(probe, keep_within=1.1)
    kept_envs = [r.env for r in ranked if r.kept]
    assert 1 < len(kept_envs) < len(ranked)  # the probe left some settings out
    trials, attrs = read_only(f"sqlite:///{wd / 'optuna.db'}", spec.name)  # type: ignore[misc]
    assert attrs["probe"]["kept"] == len(kept_envs)
    measured = [t for t in trials if t.role == "search" and not t.attrs.get("skipped")]
    assert measured and summary.complete >= 5
    for t in measured:  # every measured NCCL setting is one the probe kept
        env = {k: str(v) for k, v in t.params.items() if k.startswith("NCCL_") and v is not None}
        assert env in kept_envs, env
    warm = sorted((t.attrs["warm_start"], t.attrs["probe_setting"]) for t in trials if "warm_start" in t.attrs)
    # budget.trials 15: a warm start of three launches (at most a fifth of the trials)
    assert warm_start_size(spec) == 3
    best = [r.setting for r in ranked if r.kept][:3]
    assert [label for _, label in warm] == best  # the fastest kept settings first, with speculation on
    first = next(t for t in trials if t.attrs.get("warm_start") == 1)
    assert first.params["speculative_algorithm"] == "EAGLE3"

    # Resumed with a larger budget: the probe is not run again (probe.json untouched), the kept set holds.
    mtime = (wd / "probe.json").stat().st_mtime_ns
    events = []
    Sweep(spec, wd, executor=ModelExecutor(2), resume=True, n_trials=18, on_event=events.append).run()
    assert not [e for e in events if isinstance(e, st.ProbeStage)]  # the study already holds its kept settings
    assert (wd / "probe.json").stat().st_mtime_ns == mtime
    trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", spec.name)  # type: ignore[misc]
    for t in trials:
        if t.role == "search" and not t.attrs.get("skipped"):
            env = {k: str(v) for k, v in t.params.items() if k.startswith("NCCL_") and v is not None}
            assert env in kept_envs, env
    assert json.loads((wd / "sweep.json").read_text())["launched"] >= 18


def test_a_probe_json_is_reused_only_for_the_same_space_host_and_a_whole_probe(tmp_path):
    from orchestrator.probe import run_probe
    from orchestrator.sweep._probe_stage import probe_or_reuse, reusable

    data = demo_experiment(name="reuse", probe={"enabled": True, "budget": 12})
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    first = run_probe(spec, wd, budget=12)
    assert reusable(first, spec) is None
    again, how, fresh = probe_or_reuse(spec, wd)
    assert "reusing" in how and again == first and not fresh
    other_host = spec_mod.load(
        write_experiment(
            tmp_path,
            demo_experiment(
                name="reuse",
                probe={"enabled": True, "budget": 12},
                simulator={"hardware_profile": "pcie-rtxpro6000-x8-turin"},
            ),
            name="turin.yaml",
        )
    )
    assert "pcie-rtxpro6000-x8-turin" in (reusable(first, other_host) or "")
    cut = first.model_copy(update={"settings": first.settings[:5]})
    assert "cut short" in (reusable(cut, spec) or "")
    fewer_knobs = demo_experiment(name="reuse", probe={"enabled": True, "budget": 12})
    fewer_knobs["search_space"] = [str(tmp_path / "small.yaml")]
    (tmp_path / "small.yaml").write_text("name: s\nparams:\n  NCCL_PROTO: {choices: [null, LL]}\n")
    assert "space changed" in (reusable(first, spec_mod.load(write_experiment(tmp_path, fewer_knobs, "s.yaml"))) or "")


def test_the_probe_s_real_scale_time_comes_before_the_first_launch_on_the_clock(tmp_path, sqlite_store_template):
    """At simulator.time_scale 1 (a night at real scale) stage one costs the cost model's probe seconds
    (results.cost.probe_seconds) before any trial starts, so the night's budget pays for it."""
    data = demo_experiment(
        name="probeclock",
        budget={"trials": 2, "concurrent_trials": 1, "trial_timeout_s": 7200},
        server={"startup_timeout_s": 3600},
        promotion={"max_rounds": 0},
        probe={"enabled": True},
        simulator={"time_scale": 1.0},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    executor = ModelExecutor(1)
    Sweep(spec, wd, executor=executor).run()
    probe = read_probe(wd / "probe.json")
    first = json.loads((wd / "trials" / "0000" / "outcome.json").read_text())
    epoch = executor.clock.time() - executor.clock.monotonic()  # the clock's time at monotonic 0
    assert first["started_at"] - epoch >= cost_mod.probe_seconds(spec, len(probe.settings)) - 1e-6 > 0


def test_the_warm_start_takes_at_most_a_fifth_of_a_short_search(tmp_path):
    # The 20-launch night (bench/short_night.py: budget.trials 11) warm-starts from 2 kept settings; the
    # demo (20 trials) and a night bound by its wall time (budget.trials in the thousands) from 3.
    def size(trials: int) -> int:
        data = demo_experiment(name="warm", budget={"trials": trials})
        return warm_start_size(spec_mod.load(write_experiment(tmp_path, data, name=f"t{trials}.yaml")))

    assert [size(n) for n in (2, 6, 10, 11, 14, 15, 20, 100_000)] == [1, 1, 2, 2, 2, 3, 3, 3]
