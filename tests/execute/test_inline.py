"""The inline executor: trials in threads of this process, with the Ray executor's contract
(a bug in a trial is its outcome, abort kills the server and the outcome still comes back)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from e2e_helpers import demo_experiment, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.execute.inline import InlineExecutor
from orchestrator.records import FailureKind, TrialSpec, TrialStatus
from orchestrator.search import space as sp
from orchestrator.trial.server import recorded_server


def trial(tmp_path: Path, number: int = 0, **overrides: object) -> TrialSpec:
    spec = spec_mod.load(write_experiment(tmp_path, demo_experiment(name="inline", **overrides)))
    return TrialSpec(
        number=number, params=sp.baseline_params(spec.space), trial_dir=str(tmp_path / f"t{number}"), experiment=spec
    )


def wait_one(executor: InlineExecutor, timeout_s: float = 900.0):  # type: ignore[no-untyped-def]  # a hang guard
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done := executor.wait(0.5):
            return done
    pytest.fail("no trial finished in time")


def test_a_trial_runs_and_its_outcome_comes_back(tmp_path: Path) -> None:
    executor = InlineExecutor(1)
    assert executor.start().slots == 1 and executor.idle() == 1
    handle = executor.submit(trial(tmp_path))
    assert executor.idle() == 0
    (done,) = wait_one(executor)
    assert done.handle == handle and done.lost is None
    assert done.outcome.status is TrialStatus.COMPLETE and (tmp_path / "t0" / "outcome.json").exists()
    assert executor.idle() == 1


def test_a_trial_that_raises_is_an_internal_error_outcome(tmp_path: Path) -> None:
    executor = InlineExecutor(1)
    broken = TrialSpec(number=3, params={}, trial_dir=str(tmp_path / "t3"), experiment={"not": "an experiment"})
    executor.submit(broken)
    (done,) = wait_one(executor)
    assert done.outcome.failure_kind is FailureKind.internal_error and done.lost
    assert done.outcome.reason.startswith("the trial raised ") and done.outcome.reason.endswith(
        "(traceback in sweep.log)"
    )


def test_submit_with_every_slot_busy_is_refused(tmp_path: Path) -> None:
    executor = InlineExecutor(1)
    executor.submit(trial(tmp_path))
    with pytest.raises(RuntimeError, match="all 1 slots busy"):
        executor.submit(trial(tmp_path, number=1))
    wait_one(executor)


def test_abort_kills_the_server_and_the_outcome_still_comes_back(tmp_path: Path) -> None:
    executor = InlineExecutor(1)
    # A benchmark of 200 x 256 tokens at one stream takes the simulator about 15 minutes: the abort
    # lands while the server runs, and only the abort can end the trial before the benchmark does.
    requests, output_len = 200, 256
    handle = executor.submit(trial(tmp_path, benchmark={"requests": requests, "output_len": output_len}))
    deadline = time.monotonic() + 600  # waits for the server to start, however loaded the machine is
    while (server := recorded_server(tmp_path / "t0")) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server is not None, "the trial's server never started"
    executor.abort(handle)
    (done,) = wait_one(executor, timeout_s=1200)  # a hang guard; the benchmark alone would take 900 s
    assert done.outcome.status is TrialStatus.FAILED and done.lost is None
    bench = tmp_path / "t0" / "bench.jsonl"
    records = [json.loads(line) for line in bench.read_text().splitlines()] if bench.exists() else []
    finished = [r for r in records if r["ok"] and r["completion_tokens"] == output_len]
    assert len(finished) < requests  # cut short by the abort, not run to its end
    assert not Path(f"/proc/{server}").exists()  # the server is gone, not left running
