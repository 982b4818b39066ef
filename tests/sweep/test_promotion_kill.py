"""A driver killed during the promotion, then resumed, measures each confirmation run once and ends with the
registry, the alias, champion.env and the verdict in agreement (issue 38, item 2). In-process: a kill is an
exception no handler of the sweep catches (like SIGKILL, the driver's code stops where it is), raised by the
executor or the registry at a chosen step; real Optuna, MLflow sqlite store and registry."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from e2e_helpers import write_experiment
from loop_helpers import CountingExecutor, experiment
from mlflow import MlflowClient
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.records import TrialRole
from orchestrator.results import export
from orchestrator.sweep import state as st
from orchestrator.sweep._port import SweepPort
from orchestrator.sweep.driver import Sweep
from orchestrator.tracking.tracker import Tracker


class Killed(BaseException):
    """The driver's process ends here (nothing in the sweep catches a BaseException that is not its own)."""


class KillingExecutor(CountingExecutor):
    """Counts the confirmation runs submitted (by folder) and kills the driver at the `kill_at`-th."""

    def __init__(self, slots: int, kill_at: int | None = None) -> None:
        super().__init__(slots)
        self.kill_at = kill_at
        self.confirm_runs: list[str] = []

    def submit(self, spec):  # type: ignore[no-untyped-def]
        if spec.role is TrialRole.confirm:
            if self.kill_at is not None and len(self.confirm_runs) + 1 == self.kill_at:
                raise Killed(f"killed at confirmation run {self.kill_at}")
            self.confirm_runs.append(Path(spec.trial_dir).name)
        return super().submit(spec)


def _setup(tmp_path: Path, sqlite_store_template: Path) -> tuple[spec_mod.SweepSpec, Path]:
    data = experiment(tmp_path, steps=3, min_gain=0.05, explain=False, min_rounds=3, max_rounds=4)
    data["budget"]["trials"] = 3
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    return spec, wd


def _agree(spec: spec_mod.SweepSpec, wd: Path, summary: st.SweepSummary) -> None:
    """The registry, the alias, champion.env and the verdict name the same configuration."""
    v = summary.the_verdict()
    assert v is not None and v.promoted and v.deployed is not None, summary.verdict
    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    versions = client.search_model_versions(f"name='{spec.promotion.model_name}'")
    assert len(versions) == 1, [(x.version, x.run_id) for x in versions]
    aliased = client.get_model_version_by_alias(spec.promotion.model_name, spec.promotion.alias)
    assert str(aliased.version) == v.model_version == str(versions[0].version) and aliased.run_id == v.run_id
    env = export.parse_env((wd / "champion.env").read_text())
    assert all(env.get(k) == str(val) for k, val in v.deployed.params.items() if k.startswith("NCCL_"))
    assert f"trial: {v.deployed.number}" in (wd / "champion.env").read_text()


@pytest.mark.parametrize("kill_at", [3, 5])
def test_a_kill_during_the_rounds_resumes_from_the_last_completed_run(tmp_path, sqlite_store_template, kill_at):
    # Two arms a round (the pair): run 3 is round 2's first, run 5 round 3's first. The resumed driver keeps
    # every run the first one finished and measures only the rest.
    spec, wd = _setup(tmp_path, sqlite_store_template)
    first = KillingExecutor(2, kill_at=kill_at)
    with pytest.raises(Killed):
        Sweep(spec, wd, executor=first).run()
    assert len(first.confirm_runs) == kill_at - 1
    again = KillingExecutor(2)
    resumed = Sweep(spec, wd, executor=again, resume=True).run()
    measured = Counter(first.confirm_runs + again.confirm_runs)
    assert all(n == 1 for n in measured.values()), measured  # each confirmation run measured once
    assert not set(first.confirm_runs) & set(again.confirm_runs)
    rows = Counter((r["round"], r["who"]) for r in resumed.confirmations or [])
    assert rows and all(n == 1 for n in rows.values()), rows
    assert len(rows) == len(measured)  # the verdict rests on every run, kept or new
    _agree(spec, wd, resumed)


@pytest.mark.parametrize("after", ["alias", "env file"])
def test_a_kill_after_registration_resumes_to_the_same_version(tmp_path, sqlite_store_template, monkeypatch, after):
    # The registry version and its alias are set (and, for "env file", champion.env written), then the driver
    # dies before the verdict is kept and summary.json written: the resume measures nothing again and
    # registers nothing again; the registry, the alias, champion.env and the verdict name that version.
    spec, wd = _setup(tmp_path, sqlite_store_template)
    cls, name = (Tracker, "promote") if after == "alias" else (SweepPort, "register")
    original = getattr(cls, name)

    def then_die(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        raise Killed(f"killed after the {after}")

    monkeypatch.setattr(cls, name, then_die)
    first = KillingExecutor(2)
    with pytest.raises(Killed):
        Sweep(spec, wd, executor=first).run()
    assert (wd / "champion.env").exists() is (after == "env file") and not (wd / "summary.json").exists()
    monkeypatch.setattr(cls, name, original)
    again = KillingExecutor(2)
    resumed = Sweep(spec, wd, executor=again, resume=True).run()
    assert again.confirm_runs == [], "every confirmation run was kept"
    assert again.submitted == []
    _agree(spec, wd, resumed)


def test_a_verdict_that_promotes_nothing_withdraws_only_this_sweeps_alias(tmp_path, sqlite_store_template):
    # The alias an earlier driver of this sweep set is removed when the sweep's verdict promotes nothing
    # (sweep/_promote._withdrawn); one another sweep set is left alone.
    spec, wd = _setup(tmp_path, sqlite_store_template)
    summary = Sweep(spec, wd, executor=KillingExecutor(2)).run()
    _agree(spec, wd, summary)
    tracker = Tracker(f"sqlite:///{wd / 'mlflow.db'}", spec.tracking.experiment or spec.name, outbox_dir=wd)
    name, alias = spec.promotion.model_name, spec.promotion.alias
    assert tracker.withdraw(name, alias, "another-sweeps-parent-run") is None
    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    assert client.get_model_version_by_alias(name, alias).version is not None  # still there
    assert tracker.withdraw(name, alias, summary.parent_run_id or "") == summary.model_version
    with pytest.raises(Exception, match="alias"):
        client.get_model_version_by_alias(name, alias)
    assert tracker.withdraw(name, alias, summary.parent_run_id or "") is None  # nothing left to withdraw
