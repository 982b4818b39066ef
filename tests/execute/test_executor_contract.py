"""One contract, every executor: inline (threads + real simulator servers), Ray (a real local
instance on 127.0.0.2 + real simulator servers) and the model-backed executor (no server, virtual
clock). Optuna runs one storage test suite on every storage the same way; here the sweep's driver
may count on exactly these behaviours whichever executor it is given.

Waiting is done on the executor's own clock (a real clock for the first two, the virtual one for
the model-backed executor), so nothing here asserts on wall-clock durations.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e_helpers import demo_experiment, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.execute.base import Executor, Finished
from orchestrator.execute.inline import InlineExecutor
from orchestrator.execute.ray_actor import RayExecutor
from orchestrator.records import FailureKind, ParamValue, TrialOutcome, TrialSpec, TrialStatus
from orchestrator.search import space as sp
from orchestrator.testing import ModelExecutor

SPECULATING: dict[str, ParamValue] = {
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 4,
    "speculative_num_draft_tokens": 8,
}

Make = Callable[[spec_mod.SweepSpec], Executor]
MAKERS: dict[str, Make] = {
    "inline": lambda spec: InlineExecutor(1),
    "ray": lambda spec: RayExecutor(tp=spec.server.tp, concurrent=1, logical_gpus=spec.server.tp),
    "model": lambda spec: ModelExecutor(1),
}


def experiment(tmp_path: Path, **overrides: object) -> spec_mod.SweepSpec:
    return spec_mod.load(
        write_experiment(
            tmp_path,
            demo_experiment(name="contract", **overrides),
            name=f"exp-{len(list(tmp_path.glob('exp-*')))}.yaml",
        )
    )


def trial(spec: spec_mod.SweepSpec, tmp_path: Path, number: int, **params: ParamValue) -> TrialSpec:
    return TrialSpec(
        number=number,
        params={**sp.baseline_params(spec.space), **params},
        seed=number,
        trial_dir=str(tmp_path / f"t{number}"),
        experiment=spec,
    )


@pytest.fixture(params=sorted(MAKERS))
def executor(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Executor]]:
    spec = experiment(tmp_path)
    made = MAKERS[request.param](spec)
    made.start()
    yield request.param, made
    made.close()


def wait_all(executor: Executor, count: int, budget_s: float = 180.0) -> list[Finished]:
    """Wait on the executor's own clock until `count` trials ended (at most `budget_s` of it)."""
    clock = executor.clock
    deadline = clock.monotonic() + budget_s
    done: list[Finished] = []
    while len(done) < count and clock.monotonic() < deadline:
        done += executor.wait(0.5)
    assert len(done) == count, f"{len(done)} of {count} trials ended within {budget_s:g}s of the executor's clock"
    return done


def files_of(outcome: TrialOutcome) -> dict[str, object]:
    d = Path(outcome.trial_dir)
    return {
        "spec": json.loads((d / "spec.json").read_text()),
        "launch": json.loads((d / "launch.json").read_text()),
        "outcome": json.loads((d / "outcome.json").read_text()),
    }


def test_a_trial_comes_back_measured_with_its_files(executor: tuple[str, Executor], tmp_path: Path) -> None:
    name, ex = executor
    spec = experiment(tmp_path)
    assert ex.idle() == 1
    before = ex.clock.time()
    handle = ex.submit(trial(spec, tmp_path, 0))
    assert ex.idle() == 0
    (done,) = wait_all(ex, 1)
    assert done.handle == handle and done.lost is None and ex.idle() == 1
    out = done.outcome
    assert out.status is TrialStatus.COMPLETE and out.failure_kind is None
    assert out.metrics is not None and out.metrics.decode_tok_s > 0 and out.metrics.output_tok_s > 0
    assert before <= out.started_at <= out.finished_at <= ex.clock.time()
    assert out.timings["server_start"] > 0 and out.timings["bench"] > 0
    assert out.effective_env["ok"] and out.effective_env["expected_ranks"] == spec.server.tp
    assert out.launch is not None and out.launch.argv[1:3] == ("-m", "orchestrator.simulator")
    if name != "model":  # a real server ran at the driver's own priority, not Ray's worker niceness (15)
        assert {p["nice"] for p in out.effective_env["processes"]} == {os.nice(0)}, out.effective_env["processes"]
        assert not any("niceness" in w for w in out.warnings), out.warnings
    files = files_of(out)
    assert files["spec"]["number"] == 0 and files["launch"]["argv"] == list(out.launch.argv)  # type: ignore[index]
    assert TrialOutcome.model_validate(files["outcome"]) == out  # outcome.json is the outcome, written first


def test_submit_with_every_slot_busy_is_refused(executor: tuple[str, Executor], tmp_path: Path) -> None:
    _, ex = executor
    spec = experiment(tmp_path)
    ex.submit(trial(spec, tmp_path, 0))
    with pytest.raises(RuntimeError, match="all 1 slots busy"):
        ex.submit(trial(spec, tmp_path, 1))
    wait_all(ex, 1)
    assert ex.wait(0.1) == []  # nothing running: nothing comes back


def test_speculation_is_measured_with_its_acceptance(executor: tuple[str, Executor], tmp_path: Path) -> None:
    _, ex = executor
    spec = experiment(tmp_path)
    ex.submit(trial(spec, tmp_path, 2, **SPECULATING))
    (done,) = wait_all(ex, 1)
    m = done.outcome.metrics
    assert done.outcome.status is TrialStatus.COMPLETE and m is not None
    assert m.accept_length is not None and m.accept_length > 1.0


@pytest.mark.parametrize(
    "fault, params, kind, words",
    [
        ("oom_above_draft_tokens=4", SPECULATING, FailureKind.oom, "out of memory"),
        ("env_drop", {"NCCL_PROTO": "LL"}, FailureKind.env_not_applied, "NCCL_PROTO did not reach"),
        ("crash_after_tokens=1", {}, FailureKind.server_crash, ""),
    ],
)
def test_an_injected_fault_comes_back_as_its_failure_kind(
    executor: tuple[str, Executor],
    tmp_path: Path,
    fault: str,
    params: dict[str, ParamValue],
    kind: FailureKind,
    words: str,
) -> None:
    _, ex = executor  # the experiment (and its faults) travels in the TrialSpec
    spec = experiment(tmp_path, simulator={"faults": [fault]})
    ex.submit(trial(spec, tmp_path, 3, **params))
    (done,) = wait_all(ex, 1)
    out = done.outcome
    assert out.status is TrialStatus.FAILED and out.failure_kind is kind, (out.failure_kind, out.reason)
    assert words.lower() in out.reason.lower() and out.log_tail
    assert json.loads((Path(out.trial_dir) / "outcome.json").read_text())["failure_kind"] == kind.value


def test_abort_ends_a_running_trial_and_its_outcome_still_comes_back(
    executor: tuple[str, Executor], tmp_path: Path
) -> None:
    _, ex = executor
    spec = experiment(tmp_path, benchmark={"requests": 200, "output_len": 256})
    handle = ex.submit(trial(spec, tmp_path, 4))
    clock = ex.clock
    deadline = clock.monotonic() + 60
    # A real server is aborted once it runs (its pid file exists); the model-backed one at once.
    while (
        isinstance(ex, (InlineExecutor, RayExecutor))
        and not (tmp_path / "t4" / "server.pid").exists()
        and clock.monotonic() < deadline
    ):
        clock.sleep(0.1)
    ex.abort(handle)
    (done,) = wait_all(ex, 1)
    assert done.handle == handle and done.outcome.status is TrialStatus.FAILED
    assert ex.idle() == 1


def test_an_abort_sent_before_the_trial_began_still_ends_it(executor: tuple[str, Executor], tmp_path: Path) -> None:
    """At once after submit: Ray's actor may not have begun run() yet (it skips the trial), the inline
    thread not started its server (every server it starts is killed until it returns). Under load both
    once let the trial run to its end (the abort watched for 60 s, or was dropped before run() began)."""
    _, ex = executor
    spec = experiment(tmp_path, benchmark={"requests": 200, "output_len": 256})
    handle = ex.submit(trial(spec, tmp_path, 5))
    ex.abort(handle)
    (done,) = wait_all(ex, 1)
    assert done.handle == handle and done.outcome.status is TrialStatus.FAILED, done.outcome.reason
    assert ex.idle() == 1
