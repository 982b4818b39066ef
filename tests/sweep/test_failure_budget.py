"""The failure budget judges the set-up, not the search (issue 34): failures the parameters explain
never end the night; a broken set-up does (the default configuration fails, or every configuration
fails the same way whatever its parameters), and the stop says which. The rule as a table on
outcomes, then whole small sweeps of the real driver on the model-backed executor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.records import FailureKind, TrialOutcome, TrialRole, TrialStatus
from orchestrator.search.study import read_only
from orchestrator.sweep import state as st
from orchestrator.sweep._record import default_configuration, unexplained
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def _o(n: int, proto: str | None, algo: str | None, kind: FailureKind | None = None) -> TrialOutcome:
    """A search trial that failed with `kind`, or a measured baseline when `kind` is None."""
    status = TrialStatus.COMPLETE if kind is None else TrialStatus.FAILED
    role = TrialRole.baseline if kind is None else TrialRole.search
    return TrialOutcome(
        number=n,
        params={"NCCL_PROTO": proto, "NCCL_ALGO": algo},
        role=role,
        status=status,
        failure_kind=kind,
        reason="r",
    )


HANG, OOM, LOST = FailureKind.nccl_hang, FailureKind.oom, FailureKind.worker_lost
BASELINE = _o(0, None, None)
NOTHING_SHARED = "all nccl_hang with nothing in their parameters that the measured trials run without"
MATCHED = "all nccl_hang in configurations that measured trials match value for value, two knobs at a time"


def _searched(n: int, proto: str | None, algo: str | None) -> TrialOutcome:
    return _o(n, proto, algo).model_copy(update={"role": TrialRole.search})


@pytest.mark.parametrize(
    ("failures", "measured", "words"),
    [
        # nothing measured yet (the baseline in flight): nothing to tell a region from
        ([_o(1, "LL128", "Ring", HANG), _o(2, "LL", "Tree", HANG)], [], None),
        # only the baseline measured: one region (NCCL_PROTO=LL128) it runs outside
        ([_o(1, "LL128", "Ring", HANG), _o(2, "LL128", "Tree", HANG), _o(3, "LL128", None, HANG)], [BASELINE], None),
        # two kinds: the parameters make the difference
        ([_o(1, "LL", "Ring", HANG), _o(2, "Simple", "Tree", OOM)], [BASELINE], None),
        # only the baseline measured, one kind, nothing shared: whatever the parameters, it fails
        (
            [_o(1, "LL", "Ring", HANG), _o(2, "Simple", "Tree", HANG), _o(3, None, "Ring", HANG)],
            [BASELINE],
            NOTHING_SHARED,
        ),
        # search trials measured: a region of two values (LL128 with Ring) none of them runs
        (
            [_o(1, "LL128", "Ring", HANG), _o(2, "LL128", "Ring", HANG)],
            [BASELINE, _searched(3, "LL128", "Tree"), _searched(4, "LL", "Ring")],
            None,
        ),
        # search trials measured at the very points that also failed: failures regardless of the parameters
        (
            [_o(1, "LL", "Ring", HANG), _o(2, "Simple", None, HANG)],
            [BASELINE, _searched(3, "LL", "Ring"), _searched(4, "Simple", None)],
            MATCHED,
        ),
        # the machine, not a configuration
        (
            [_o(1, "LL128", "Ring", LOST), _o(2, "LL128", "Ring", LOST)],
            [BASELINE],
            "all worker_lost: failures of the machine, not of any configuration",
        ),
        ([], [BASELINE], None),
    ],
)
def test_which_failures_the_parameters_explain(
    failures: list[TrialOutcome], measured: list[TrialOutcome], words: str | None
) -> None:
    assert unexplained(failures, [*measured, *failures]) == words


# ---------------------------------------------------------------------- whole sweeps


def _space(tmp_path: Path, params: dict[str, Any]) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"name": "budget", "params": params}))
    return path


NCCL = {"NCCL_PROTO": {"choices": [None, "LL", "LL128", "Simple"]}, "NCCL_ALGO": {"choices": [None, "Ring", "Tree"]}}
TIGHT = {"max_failure_rate": 0.2, "min_trials_for_failure_rate": 3, "max_consecutive_failures": 2}
"""A budget that the old rule (any failures past these) ended every sweep below with."""


def _run(tmp_path: Path, template: Path, data: dict[str, Any]) -> tuple[Path, st.SweepSummary, list[TrialOutcome]]:
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(template, wd)
    summary = Sweep(spec, wd, executor=ModelExecutor(2)).run()
    trials, _ = read_only(f"sqlite:///{wd / 'optuna.db'}", data["name"]) or ([], {})
    launched = [t for t in trials if not t.attrs.get("skipped") and t.state in ("COMPLETE", "FAIL")]
    return wd, summary, launched


def test_failures_the_parameters_explain_never_stop_the_night(tmp_path, sqlite_store_template):
    """Half the space hangs (NCCL_PROTO LL128 or Simple): far above max_failure_rate 0.2, twice in a row
    and more, and the sweep still spends its whole trial budget."""
    data = demo_experiment(
        name="explained",
        sampler={"kind": "random", "seed": 3},
        simulator={"faults": [{"fault": "nccl_hang", "when": {"NCCL_PROTO": ["LL128", "Simple"]}}]},
        benchmark={"stall_timeout_s": 2},
        budget={"trials": 10, "concurrent_trials": 2, **TIGHT},
        promotion={"max_rounds": 0},
    )
    data["search_space"] = [str(_space(tmp_path, NCCL))]
    _, summary, launched = _run(tmp_path, sqlite_store_template, data)
    assert summary.failures.get("nccl_hang", 0) >= 3, summary.failures
    assert summary.failed / (summary.failed + summary.complete) > TIGHT["max_failure_rate"]
    assert summary.stop_kind is not None and not summary.stopped_by_failure, summary.stop_reason
    assert summary.stop_kind in (st.StopKind.trial_budget, st.StopKind.grid_exhausted, st.StopKind.space_exhausted)
    assert summary.champion is not None and summary.champion["params"]["NCCL_PROTO"] not in ("LL128", "Simple")


def test_every_configuration_failing_alike_stops_the_night_and_says_so(tmp_path, sqlite_store_template):
    """Every point but the baseline's crashes, whatever NCCL setting it runs: the set-up is broken."""
    data = demo_experiment(
        name="broken",
        sampler={"kind": "random", "seed": 0},
        simulator={
            "faults": [
                {"fault": "crash_after_tokens=1", "when": {"NCCL_PROTO": ["LL", "LL128", "Simple"]}},
                {"fault": "crash_after_tokens=1", "when": {"NCCL_ALGO": ["Ring", "Tree"]}},
            ]
        },
        budget={"trials": 12, "concurrent_trials": 2, "max_failure_rate": 0.5, "min_trials_for_failure_rate": 4},
        promotion={"max_rounds": 0},
    )
    data["search_space"] = [str(_space(tmp_path, NCCL))]
    _, summary, launched = _run(tmp_path, sqlite_store_template, data)
    assert summary.stop_kind in (st.StopKind.failure_rate, st.StopKind.consecutive_failures), summary.stop_reason
    assert summary.stopped_by_failure
    assert summary.stop_reason.startswith("the set-up is broken: "), summary.stop_reason
    assert "all server_crash with nothing in their parameters that the measured trials run without" in (
        summary.stop_reason
    )
    assert len(launched) < 12  # stopped before the budget was spent on a broken set-up


def test_the_default_configuration_failing_stops_the_night(tmp_path, sqlite_store_template):
    """The model's default speculation (EAGLE-3, 3 steps, top-k 1 for kimi-k2.5) crashes with NCCL at its
    defaults: no tuned configuration can be trusted over a set-up whose defaults fail."""
    data = demo_experiment(
        name="nodefaults",
        sampler={"kind": "grid", "seed": 0},
        simulator={
            "faults": [
                {
                    "fault": "crash_after_tokens=1",
                    "when": {"NCCL_PROTO": None, "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3},
                }
            ]
        },
        budget={"trials": 12, "concurrent_trials": 1, "max_failure_rate": 0.9, "max_consecutive_failures": 10},
        promotion={"max_rounds": 0},
    )
    params = {
        "NCCL_PROTO": {"choices": [None, "LL"]},
        "speculative_algorithm": {"choices": [None, "EAGLE3"]},
        "speculative_num_steps": {"low": 2, "high": 3, "when": {"speculative_algorithm": "EAGLE3"}},
        "speculative_eagle_topk": {"choices": [1], "when": {"speculative_algorithm": "EAGLE3"}},
    }
    data["search_space"] = [str(_space(tmp_path, params))]
    spec = spec_mod.load(write_experiment(tmp_path, data))
    default = default_configuration(spec)
    assert default is not None and default["speculative_num_steps"] == 3 and default["NCCL_PROTO"] is None
    wd, summary, launched = _run(tmp_path, sqlite_store_template, data)
    assert summary.stop_kind is st.StopKind.defaults_failed and summary.stopped_by_failure, summary.stop_reason
    assert summary.stop_reason.startswith(
        "the set-up is broken: the default configuration (the model's default speculation, engine defaults "
        "elsewhere) failed in trial "
    ), summary.stop_reason
    assert "server_crash" in summary.stop_reason and "server.log" in summary.stop_reason
    assert len(launched) < 6  # the grid has 6 points: it stopped at the default's failure
