"""The verdict in-process (inline executor, simulator, real Optuna and MLflow sqlite stores): why the
champion won, the simpler configuration when a part adds nothing, the load where it stops paying, and
what `sweep export` says when the sweep promoted nothing."""

from __future__ import annotations

from e2e_helpers import write_experiment
from loop_helpers import CountingExecutor, experiment, run_sweep
from mlflow import MlflowClient
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)
from typer.testing import CliRunner

from orchestrator import cli
from orchestrator.config import experiment as spec_mod
from orchestrator.results import export
from orchestrator.sweep import state as st
from orchestrator.sweep.driver import Sweep


def test_summary_names_each_contribution(tmp_path, sqlite_store_template):
    wd, summary, _, _ = run_sweep(tmp_path, sqlite_store_template, experiment(tmp_path, steps=3, min_gain=0.05))
    assert summary.champion is not None and summary.champion["params"] == {
        "NCCL_P2P_LEVEL": "SYS",
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
    }
    parts = {p.part: p.interval for p in summary.contributions}
    # The runner-up's row is named for each run's own speed taken out where the rounds' TTFT slope passed its
    # test (verdict.speed), which on real-time simulator runs depends on the machine's load.
    runner = [p for p in parts if p.startswith("champion over the runner-up")]
    assert runner in (["champion over the runner-up"], ["champion over the runner-up (each run's own speed taken out)"])
    assert list(parts) == [
        "NCCL settings",
        "EAGLE-3 on top",
        "EAGLE-3 alone (NCCL at defaults)",
        "NCCL settings on top of EAGLE-3",
        *runner,
    ]
    assert parts["NCCL settings"].low > 0.2 and parts["EAGLE-3 alone (NCCL at defaults)"].low > 0.1
    for part in parts:
        assert part in (summary.verdict or "")
    assert summary.promoted and summary.outcome is st.Outcome.promoted
    # +8% from speculation on top is near what 3 rounds resolve: it may be kept or dropped as not significant.
    assert summary.promoted_config in ("champion", "no_speculation")
    assert summary.confirmed is not None and summary.confirmed.label == "confirmed"
    header = (wd / "champion.env").read_text()
    assert "confirmed_gain" in header and "search_decode_tok_s" in header
    assert set(summary.importances) >= {"NCCL_P2P_LEVEL", "speculative_algorithm"}


def test_speculation_adding_nothing_is_not_promoted(tmp_path, sqlite_store_template):
    # One draft step adds about -1% on top of NCCL_P2P_LEVEL=SYS: whichever of the two wins the search
    # phase, what is promoted runs without speculation.
    wd, summary, _, _ = run_sweep(tmp_path, sqlite_store_template, experiment(tmp_path, steps=1, min_gain=0.05))
    assert summary.promoted and summary.outcome is st.Outcome.promoted
    env = export.parse_env((wd / "champion.env").read_text())
    assert "speculative" not in env.get(export.ARGS_VAR, "") and env.get("NCCL_P2P_LEVEL") == "SYS"
    if summary.champion and summary.champion["params"].get("speculative_algorithm"):
        assert summary.promoted_config == "no_speculation"
        assert "promoted the simpler configuration without speculation" in (summary.verdict or "")
        assert any(p.part == "EAGLE-3 on top" and not p.interval.significant for p in summary.contributions)


def test_per_concurrency_verdict_and_export_without_a_champion(tmp_path, sqlite_store_template):
    # About +60% at one stream is not the +80% asked for: not better.
    data = experiment(tmp_path, steps=3, min_gain=0.8, explain=False, concurrency=[1, 16])
    wd, summary, _, _ = run_sweep(tmp_path, sqlite_store_template, data)
    assert summary.outcome is st.Outcome.not_better and not summary.promoted
    assert "not better" in (summary.verdict or "") and "promotion.min_gain" in (summary.verdict or "")
    levels = {lv.concurrency: lv.interval for lv in summary.concurrency}
    assert set(levels) == {1, 16}
    assert levels[1].low > 0.10 and levels[16].gain < levels[1].gain  # the gain shrinks with load
    assert "stops paying from concurrency 16" in (summary.concurrency_verdict or "")

    result = CliRunner().invoke(cli.app, ["export", "--workdir", str(wd), "-o", str(tmp_path / "c.env")])
    assert result.exit_code == 3, result.output
    assert "finished without a champion (not better)" in result.output
    assert not (tmp_path / "c.env").exists()


def test_resuming_a_decided_sweep_measures_and_registers_nothing_again(tmp_path, sqlite_store_template):
    data = experiment(tmp_path, steps=3, min_gain=0.05, explain=False)
    data["budget"]["trials"] = 20  # the command line's --n-trials 3 below is what counts, on resume too
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    first = Sweep(spec, wd, executor=CountingExecutor(2), n_trials=3).run()
    assert first.promoted and first.launched == 3

    again = CountingExecutor(2)
    resumed = Sweep(spec, wd, executor=again, resume=True).run()
    assert again.submitted == []  # the original budget (3), not the file's 20; no confirmation again
    assert resumed.promoted and resumed.model_version == first.model_version
    assert "already decided before this --resume" in (resumed.verdict or "")
    versions = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}").search_model_versions(
        f"name='{spec.promotion.model_name}'"
    )
    assert len(versions) == 1


def test_no_gate_promotes_the_search_phase_champion_labelled_unconfirmed(tmp_path, sqlite_store_template):
    data = experiment(tmp_path, steps=3, max_rounds=0)
    data["budget"]["trials"] = 2
    wd, summary, _, events = run_sweep(tmp_path, sqlite_store_template, data)
    assert not [e for e in events if isinstance(e, st.ConfirmationRun)]
    assert summary.promoted and summary.outcome is st.Outcome.unconfirmed
    assert summary.confirmed is not None and summary.confirmed.label == "unconfirmed"
    assert (summary.verdict or "").startswith("UNCONFIRMED: promotion.max_rounds is 0")
    header = (wd / "champion.env").read_text()
    assert "unconfirmed_gain" in header and "confirmed_gain" not in header.replace("unconfirmed_gain", "")
